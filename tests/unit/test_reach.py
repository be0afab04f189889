"""module_utils/vllm_reach.py: the monitoring host's reachability probe, with real sockets on loopback."""

import errno
import os
import socket
import time

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils import vllm_reach

TIMEOUT = 0.5


@pytest.fixture
def listening():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def closed_port():
    # A port that was just free on loopback: nothing listens there, the kernel answers with a reset.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


def test_a_listening_port_is_connected(listening):
    assert vllm_reach.connect("127.0.0.1", listening, TIMEOUT) == (vllm_reach.CONNECTED, "")


def test_a_closed_port_is_refused_which_is_fine(closed_port):
    assert vllm_reach.connect("127.0.0.1", closed_port, TIMEOUT) == (vllm_reach.REFUSED, "connection refused")


@pytest.fixture
def full_backlog():
    """A listening port on loopback whose accept queue is full: the kernel drops further SYNs, so a connection
    times out, as through a firewall that drops."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    held = []
    for _n in range(3):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        held.append(client)
    time.sleep(0.1)
    yield port
    for client in held:
        client.close()
    server.close()


def test_a_port_that_does_not_answer_times_out(full_backlog):
    started = time.monotonic()
    assert vllm_reach.connect("127.0.0.1", full_backlog, TIMEOUT) == (
        vllm_reach.UNREACHABLE,
        f"timed out after {TIMEOUT:g} s",
    )
    assert time.monotonic() - started < TIMEOUT + 1


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (errno.EHOSTUNREACH, "no route to host"),
        (errno.ENETUNREACH, "the network is unreachable"),
        (errno.EACCES, os.strerror(errno.EACCES)),
    ],
)
def test_no_route_is_unreachable(monkeypatch, error, reason):
    def fail(*_args, **_kwargs):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(vllm_reach.socket, "create_connection", fail)
    assert vllm_reach.connect("10.0.0.5", 8000, TIMEOUT) == (vllm_reach.UNREACHABLE, reason)


def test_a_name_that_does_not_resolve_is_unreachable():
    # .invalid (RFC 2606) never resolves.
    state, reason = vllm_reach.connect("no-such-host.invalid", 9100, TIMEOUT)
    assert state == vllm_reach.UNREACHABLE
    assert reason.startswith("the name does not resolve"), reason


def test_every_target_is_answered_in_order_and_each_pair_is_tried_once(
    listening, closed_port, full_backlog, monkeypatch
):
    tried = []
    real = vllm_reach.connect

    def counting(address, port, timeout):
        tried.append((address, port))
        return real(address, port, timeout)

    monkeypatch.setattr(vllm_reach, "connect", counting)
    targets = [
        {"name": "serve-1", "address": "127.0.0.1", "port": listening},
        {"name": "serve-1", "address": "127.0.0.1", "port": str(closed_port)},
        {"name": "lb-1", "address": "127.0.0.1", "port": full_backlog},
        {"name": "ghost", "address": "no-such-host.invalid", "port": 9100},
        {"name": "serve-1-again", "address": "127.0.0.1", "port": listening},
    ]
    started = time.monotonic()
    results = vllm_reach.reach(targets, TIMEOUT)
    # All at once: the slow ones wait together.
    assert time.monotonic() - started < 2 * TIMEOUT + 1
    assert sorted(tried) == sorted(set(tried)) and len(tried) == 4
    assert [(r["name"], r["port"], r["state"]) for r in results] == [
        ("serve-1", listening, "connected"),
        ("serve-1", closed_port, "refused"),
        ("lb-1", full_backlog, "unreachable"),
        ("ghost", 9100, "unreachable"),
        ("serve-1-again", listening, "connected"),
    ]
    problems = vllm_reach.problems("mon-1", results)
    assert len(problems) == 2, problems
    assert problems[0] == (
        f"mon-1: monitoring: cannot reach lb-1 (127.0.0.1) port {full_backlog} from the monitoring host (timed out"
        f" after {TIMEOUT:g} s); fix: open the network path from mon-1 to that port, or set"
        " monitoring_target_address_var to an address it can reach."
    )
    assert problems[1].startswith(
        "mon-1: monitoring: cannot reach ghost (no-such-host.invalid) port 9100 from the monitoring host (the name does"
        " not resolve"
    )
    for problem in problems:
        assert problem.endswith(
            "; fix: open the network path from mon-1 to that port, or set monitoring_target_address_var to an"
            " address it can reach."
        )


def test_the_message_names_the_target_and_why():
    results = [
        {
            "name": "serve-vllm-1",
            "address": "10.0.0.5",
            "port": 8000,
            "state": "unreachable",
            "reason": "timed out after 2 s",
        },
        {
            "name": "serve-vllm-2",
            "address": "serve-vllm-2",
            "port": 8000,
            "state": "unreachable",
            "reason": "no route to host",
        },
        {
            "name": "serve-vllm-3",
            "address": "10.0.0.7",
            "port": 8000,
            "state": "refused",
            "reason": "connection refused",
        },
    ]
    assert vllm_reach.problems("mon-1", results) == [
        "mon-1: monitoring: cannot reach serve-vllm-1 (10.0.0.5) port 8000 from the monitoring host (timed out after"
        " 2 s); fix: open the network path from mon-1 to that port, or set monitoring_target_address_var to an address"
        " it can reach.",
        "mon-1: monitoring: cannot reach serve-vllm-2 port 8000 from the monitoring host (no route to host); fix: open"
        " the network path from mon-1 to that port, or set monitoring_target_address_var to an address it can reach.",
    ]


def test_no_targets_no_connections():
    assert vllm_reach.reach([], TIMEOUT) == []
    assert vllm_reach.problems("mon-1", []) == []
