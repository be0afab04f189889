"""The rollout's capacity floor (issue 41, item 4), through ansible-playbook and the roles' own task files.

Before any host of a batch drains, roles/rollout/tasks/capacity.yml reads every server's state on every load
balancer once (loadbalancer tasks_from backend_capacity, run once per batch) and refuses the batch when a load
balancer would keep fewer than rollout_min_available servers UP and ready besides those of the batch's draining
hosts. Six backend hosts, two load balancers; no HAProxy runs: `socat` on PATH is a stand-in for each load
balancer's admin socket (the real `show servers state` header; states from a JSON file beside the socket path;
every command logged). A marker per host stands for the drain that follows the check.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
HOSTS = [f"h{i}" for i in range(1, 7)]
LBS = ["lb1", "lb2"]

FAKE_SOCAT = """#!{python}
import json, sys
import os
# Every load balancer here is this machine: its Python (the delegated host's interpreter) names it.
socket = os.path.join(os.environ["FAKE_LB_DIR"], os.environ["FAKE_LB"] + ".sock")
line = sys.stdin.read().strip()
with open(socket + ".log", "a") as log:
    log.write(line + "\\n")
servers = json.load(open(socket + ".json"))
if line.split()[:3] != ["show", "servers", "state"]:
    sys.exit("unexpected command: " + line)
print("1")
print("# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight")
for i, (name, s) in enumerate(sorted(servers.items())):
    admin = {{"ready": 0, "maint": 1, "drain": 8}}[s["admin"]]
    print(f"3 vllm {{i + 1}} {{name}} 10.0.0.{{i + 1}} {{2 if s['up'] else 0}} {{admin}} 1")
"""


def run(tmp_path, serial, draining, states=None, extra=(), check=False):
    """One rollout-shaped play; returns (rc, output, hosts that passed the check, admin socket commands per LB)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "socat").write_text(FAKE_SOCAT.format(python=sys.executable))
    (bin_dir / "socat").chmod(0o755)
    for lb in LBS:
        (bin_dir / f"python-{lb}").write_text(f"#!/bin/sh\nFAKE_LB={lb} exec {sys.executable} \"$@\"\n")
        (bin_dir / f"python-{lb}").chmod(0o755)
    marks = tmp_path / "marks"
    shutil.rmtree(marks, ignore_errors=True)
    marks.mkdir()
    for lb in LBS:
        live = {f"{h}-vllm-0": {"admin": "ready", "up": True} for h in HOSTS}
        live.update((states or {}).get(lb, {}))
        (tmp_path / f"{lb}.sock.json").write_text(json.dumps(live))
        (tmp_path / f"{lb}.sock.log").write_text("")
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "vllm_hosts": {"hosts": {h: {} for h in HOSTS}},
                "loadbalancers": {
                    "hosts": {lb: {"ansible_python_interpreter": str(bin_dir / f"python-{lb}")} for lb in LBS}
                },
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    play = [
        {
            "name": "A rollout's batches",
            "hosts": "vllm_hosts",
            "gather_facts": False,
            "serial": serial,
            "max_fail_percentage": 0,
            "tasks": [
                {
                    "name": "Decide how this host changes",
                    "ansible.builtin.set_fact": {
                        "rollout_drained_change": "{{ inventory_hostname in " + json.dumps(draining) + " }}",
                        "rollout_loadbalancers": "{{ groups['loadbalancers'] }}",
                    },
                },
                {
                    "name": "The capacity floor",
                    "ansible.builtin.include_role": {"name": "vllm.cpu_fleet.rollout", "tasks_from": "capacity"},
                },
                {
                    "name": "Stands for the drain",
                    "ansible.builtin.file": {"path": f"{marks}/{{{{ inventory_hostname }}}}", "state": "touch",
                                             "mode": "0600"},
                    "check_mode": False,
                },
            ],
        }
    ]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        FAKE_LB_DIR=str(tmp_path),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_STDOUT_CALLBACK="default",
    )
    argv = [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"), *extra]
    if check:
        argv.append("--check")
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    commands = {lb: (tmp_path / f"{lb}.sock.log").read_text().splitlines() for lb in LBS}
    passed = sorted(p.name for p in marks.iterdir())
    return done.returncode, done.stdout + done.stderr, passed, commands


def test_batches_that_leave_servers_up_drain_and_each_lb_is_read_once_per_batch(tmp_path):
    rc, out, passed, commands = run(tmp_path, 2, HOSTS)
    assert rc == 0, out[-3000:]
    assert passed == HOSTS
    # Three batches of two, each load balancer read once per batch (not once per host).
    assert commands == {lb: ["show servers state vllm"] * 3 for lb in LBS}, commands


def test_a_batch_that_would_leave_a_load_balancer_without_a_ready_server_is_refused_before_any_drain(tmp_path):
    # lb2 already sees h3-h6 DOWN (or drained): draining h1 and h2 would leave it nothing.
    down = {
        "lb2": {
            "h3-vllm-0": {"admin": "ready", "up": False},
            "h4-vllm-0": {"admin": "drain", "up": True},
            "h5-vllm-0": {"admin": "maint", "up": False},
            "h6-vllm-0": {"admin": "ready", "up": False},
        }
    }
    rc, out, passed, _commands = run(tmp_path, 2, HOSTS, down)
    assert rc != 0
    assert passed == []
    assert "CAPACITY FLOOR: the batch h1, h2 is not drained, nothing was changed" in out, out[-3000:]
    floor = "rollout_min_available is 1"
    assert f"lb2: 0 of 6 servers would stay UP and ready while h1, h2 drain (2 of theirs); {floor}" in out
    assert "not UP and ready already: h3-vllm-0, h4-vllm-0, h5-vllm-0, h6-vllm-0" in out
    assert "lb1:" not in out.split("CAPACITY FLOOR", 1)[1].split("Fix:", 1)[0], "lb1 keeps four servers"


def test_a_batch_of_every_serving_host_is_refused_unless_the_floor_is_zero(tmp_path):
    rc, out, passed, _commands = run(tmp_path, "100%", HOSTS)
    assert rc != 0 and passed == []
    for lb in LBS:
        assert f"{lb}: 0 of 6 servers would stay UP and ready while h1, h2, h3, h4, h5, h6 drain" in out, out[-3000:]
    # From -e the value is a string.
    rc, out, passed, _commands = run(tmp_path, "100%", HOSTS, extra=["-e", "rollout_min_available=0"])
    assert rc == 0, out[-3000:]
    assert passed == HOSTS


def test_only_the_hosts_that_drain_count_and_a_higher_floor_is_kept(tmp_path):
    # Every server of lb1 but h1's and h2's is DOWN: h1 and h2 change in place (no drain), so they still serve.
    down = {"lb1": {f"{h}-vllm-0": {"admin": "ready", "up": False} for h in HOSTS[2:]}}
    rc, out, passed, _commands = run(tmp_path, 2, ["h3", "h4", "h5", "h6"], down)
    assert rc == 0, out[-3000:]
    assert passed == HOSTS
    # A floor of 5 of 6: a batch of two draining hosts leaves 4.
    rc, out, passed, _commands = run(tmp_path, 2, HOSTS, extra=["-e", "rollout_min_available=5"])
    assert rc != 0 and passed == []
    assert "lb1: 4 of 6 servers would stay UP and ready while h1, h2 drain" in out, out[-3000:]


def test_check_mode_reads_the_load_balancers_and_says_the_same(tmp_path):
    rc, out, passed, commands = run(tmp_path, "100%", HOSTS, check=True)
    assert rc != 0 and passed == []
    assert "CAPACITY FLOOR" in out and commands == {lb: ["show servers state vllm"] for lb in LBS}, out[-3000:]


def test_the_rollout_checks_the_floor_after_every_host_decided_and_before_any_drain():
    tasks = yaml.safe_load((REPO / "roles/rollout/tasks/main.yml").read_text())
    names = [t.get("name", "") for t in tasks]
    capacity = next(i for i, t in enumerate(tasks) if t.get("ansible.builtin.include_tasks") == "capacity.yml")
    decide = next(
        i for i, t in enumerate(tasks)
        for sub in t.get("block", []) if sub.get("name") == "Decide how this host changes"
    )  # fmt: skip
    change = next(
        i for i, t in enumerate(tasks)
        for sub in t.get("block", []) if sub.get("ansible.builtin.include_tasks") == "drained_change.yml"
    )  # fmt: skip
    assert decide < capacity < change, names
    # The check itself has no condition: a batch whose first host the first play served is checked too.
    assert "when" not in tasks[capacity]


@pytest.mark.parametrize("value", ["-1", "one"])
def test_a_bad_floor_is_named(tmp_path, value):
    rc, out, passed, _commands = run(tmp_path, 2, HOSTS, extra=["-e", f"rollout_min_available={value}"])
    assert rc != 0 and passed == []
    assert "rollout_min_available" in out, out[-3000:]
