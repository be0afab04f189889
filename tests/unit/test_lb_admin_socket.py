"""HAProxy's admin socket answers read by their header line: `show stat` CSV and `show servers state`.

The samples in tests/fixtures/haproxy/ are HAProxy 2.6.12 (Debian 12) answers, recorded from a
backend vllm of three servers: *_drain_maint with h1-vllm-1 in maint and h2-vllm-0 drained, *_busy
with h1-vllm-0 in maint and h1-vllm-1 drained while serving two requests."""

import csv
import io
import random

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.filter.vllm_loadbalancer import (
    vllm_lb_in_flight,
    vllm_lb_server_states,
)
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_lb_backends import (
    BackendError,
    in_flight,
    server_states,
    stat_rows,
)
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

SAMPLES = REPO / "tests" / "fixtures" / "haproxy"
SERVERS = ["h1-vllm-0", "h1-vllm-1", "h2-vllm-0"]


def sample(name):
    return (SAMPLES / name).read_text()


def reorder_csv(text, seed, extra=()):
    """The same answer with its columns in another order (and extra columns), header included."""
    lines = [line for line in text.splitlines() if line]
    header = lines[0][2:].split(",")
    rows = [next(csv.reader([line])) for line in lines[1:]]
    order = list(range(len(header)))
    random.Random(seed).shuffle(order)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([header[i] for i in order] + [name for name, _unused in extra])
    for row in rows:
        writer.writerow([row[i] for i in order] + [value for _unused, value in extra])
    return "# " + out.getvalue()


def reorder_state(text, seed):
    lines = text.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.startswith("#"))
    header = lines[header_at][1:].split()
    order = list(range(len(header)))
    random.Random(seed).shuffle(order)
    out = [*lines[:header_at], "# " + " ".join(header[i] for i in order)]
    for line in lines[header_at + 1 :]:
        fields = line.split()
        out.append(" ".join(fields[i] for i in order) if fields else line)
    return "\n".join(out) + "\n"


def test_servers_state_reads_maint_drain_ready_and_up():
    assert server_states(sample("show_servers_state_drain_maint.txt")) == {
        "h1-vllm-0": {"admin": "ready", "up": True},
        "h1-vllm-1": {"admin": "maint", "up": False},
        "h2-vllm-0": {"admin": "drain", "up": True},
    }
    assert server_states(sample("show_servers_state_busy.txt")) == {
        "h1-vllm-0": {"admin": "maint", "up": False},
        "h1-vllm-1": {"admin": "drain", "up": True},
        "h2-vllm-0": {"admin": "drain", "up": True},
    }


def test_stat_counts_the_requests_in_flight_of_the_named_servers_only():
    busy = sample("show_stat_busy.csv")
    assert in_flight(busy, SERVERS) == {"h1-vllm-0": 0, "h1-vllm-1": 2, "h2-vllm-0": 0}
    assert in_flight(busy, ["h1-vllm-1", "not-listed"]) == {"h1-vllm-1": 2}
    assert in_flight(sample("show_stat_drain_maint.csv"), SERVERS) == dict.fromkeys(SERVERS, 0)


@pytest.mark.parametrize("seed", range(5))
def test_a_shuffled_header_with_extra_columns_reads_the_same(seed):
    busy = reorder_csv(sample("show_stat_busy.csv"), seed, extra=[("new_in_3_0", "7"), ("other", "a,b")])
    assert not busy.startswith("# pxname,svname,qcur")
    assert in_flight(busy, SERVERS) == {"h1-vllm-0": 0, "h1-vllm-1": 2, "h2-vllm-0": 0}
    state = reorder_state(sample("show_servers_state_busy.txt"), seed)
    assert server_states(state) == server_states(sample("show_servers_state_busy.txt"))


def test_the_backend_and_frontend_summary_lines_are_not_servers():
    text = sample("show_stat_busy.csv") + "vllm,BACKEND,0,0,2,2,,2,0,0,0,0,,0,0,0,0,UP\n"
    assert "BACKEND" not in in_flight(text, SERVERS)
    assert [row["svname"] for row in stat_rows(text)][-1] == "BACKEND"


@pytest.mark.parametrize("column", ["scur", "svname"])
def test_a_missing_stat_column_is_named(column):
    header, *rows = sample("show_stat_busy.csv").splitlines()
    text = "\n".join([header.replace(f",{column},", ",renamed,"), *rows])
    expected = rf"^loadbalancer_admin_socket: .*'show stat' lacks {column} in its header.*; fix: "
    with pytest.raises(BackendError, match=expected):
        in_flight(text, SERVERS)


def test_a_missing_servers_state_column_is_named():
    text = sample("show_servers_state_busy.txt").replace(" srv_admin_state ", " srv_admin_status ")
    with pytest.raises(BackendError, match=r"'show servers state' lacks srv_admin_state in its header"):
        server_states(text)


def test_a_row_shorter_than_the_header_is_named():
    text = "# pxname,svname,qcur,qmax,scur\nvllm,h1-vllm-0,0\n"
    with pytest.raises(BackendError, match=r"lacks scur in the row \{'pxname': 'vllm', 'svname': 'h1-vllm-0'"):
        in_flight(text, SERVERS)


@pytest.mark.parametrize("answer", ["", "Can't find backend.\n", "Unknown command.\n"])
def test_an_answer_without_a_header_says_so_and_the_filter_names_the_host(answer):
    with pytest.raises(BackendError, match=r"has no '# ' header line"):
        server_states(answer)
    with pytest.raises(AnsibleFilterError, match=r"^lb1: loadbalancer_admin_socket: .*; fix: check that the socket"):
        vllm_lb_in_flight(answer, SERVERS, "lb1")


def test_a_non_numeric_admin_state_is_refused():
    text = sample("show_servers_state_busy.txt").replace("127.0.0.1 0 1 ", "127.0.0.1 0 x ")
    expected = r"^lb1: loadbalancer_admin_socket: srv_admin_state of h1-vllm-0 is 'x'"
    with pytest.raises(AnsibleFilterError, match=expected):
        vllm_lb_server_states(text, "lb1")
