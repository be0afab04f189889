"""The run lock through ansible-playbook (review day2-edges, finding 7): a second run started while the first
changes the fleet stops before any change, naming the holder; a run whose ansible-playbook ended is taken over
from the same controller; a lock from another controller needs vllm_fleet_break_lock; two runs that each took some
hosts give them back.

The playbook is the real playbooks/run_lock.yml, a play standing for the run's changes (it writes a marker per
host, and waits for a file when asked, as a run waits in a health gate), then the real playbooks/run_unlock.yml,
on local hosts whose lock files live in the test's directory. The negative control runs the same two runs without
run_lock.yml: the second changes the hosts while the first is still in its "gate".
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
ENV = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_RETRY_FILES_ENABLED="0")
HOSTS = ("vllm-1", "vllm-2", "lb-1")
FREE = {name: {} for name in HOSTS}
MARK = "{{ run }}-{{ inventory_hostname }}"


@pytest.fixture
def fleet(tmp_path):
    hosts = {name: {"vllm_fleet_run_lock": str(tmp_path / name / "run.lock")} for name in HOSTS}
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "vllm_hosts": {"hosts": {n: hosts[n] for n in HOSTS[:2]}},
                "loadbalancers": {"hosts": {"lb-1": hosts["lb-1"]}},
                "builders": {"hosts": {}},
                "monitoring": {"hosts": {}},
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    change = {
        "name": "Change the hosts",
        "hosts": "vllm_hosts:loadbalancers",
        "gather_facts": False,
        "tasks": [
            {"ansible.builtin.file": {"path": f"{tmp_path}/{MARK}", "state": "touch"}},
            {
                "name": "Wait in the gate",
                "ansible.builtin.wait_for": {"path": f"{tmp_path}/go-{{{{ run }}}}", "timeout": 120},
                "when": "wait | default(false) | bool",
            },
        ],
    }
    for name, locked in (("site.yml", True), ("unlocked.yml", False)):
        plays = [change]
        if locked:
            plays = [
                {"ansible.builtin.import_playbook": str(REPO / "playbooks" / "run_lock.yml")},
                change,
                {"ansible.builtin.import_playbook": str(REPO / "playbooks" / "run_unlock.yml")},
            ]
        (tmp_path / name).write_text(yaml.safe_dump(plays, sort_keys=False))
    return tmp_path


def start(fleet, run, *extra, playbook="site.yml", wait=False):
    args = [ANSIBLE_PLAYBOOK, "-i", str(fleet / "inventory.yml"), str(fleet / playbook), "-e", f"run={run}"]
    args += ["-e", "wait=true"] if wait else []
    return subprocess.Popen(
        [*args, *extra], cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def finish(proc):
    out, _unused = proc.communicate(timeout=300)
    return proc.returncode, out


def holders(fleet):
    out = {}
    for name in HOSTS:
        path = fleet / name / "run.lock"
        text = path.read_text() if path.exists() else ""
        out[name] = json.loads(text) if text.strip() else {}
    return out


def changed(fleet, run):
    return sorted(p.name.removeprefix(f"{run}-") for p in fleet.glob(f"{run}-*"))


def wait_until(predicate, what, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_second_run_stops_while_the_first_is_in_its_gate(fleet):
    first = start(fleet, "a", wait=True)
    try:
        wait_until(lambda: len(changed(fleet, "a")) == len(HOSTS), "the first run to reach its gate")
        held = holders(fleet)
        assert {h.get("pid") for h in held.values()} == {first.pid}, held
        rc, out = finish(start(fleet, "b"))
        assert rc != 0, out
        assert changed(fleet, "b") == [], f"the second run changed hosts under the first:\n{out}"
        run_id = held["vllm-1"]["run_id"]
        assert f"RUN LOCKED: vllm-1: the run lock is held by run {run_id}" in out, out
        assert "its ansible-playbook process is still running on this controller" in out, out
        assert holders(fleet) == held, "the refused run touched the first run's locks"
    finally:
        (fleet / "go-a").touch()
    rc, out = finish(first)
    assert rc == 0, out
    assert holders(fleet) == FREE, "the first run did not give its locks back"
    rc, out = finish(start(fleet, "c"))
    assert rc == 0 and changed(fleet, "c") == sorted(HOSTS), out


def test_negative_control_without_the_lock_the_second_run_changes_the_hosts(fleet):
    first = start(fleet, "a", playbook="unlocked.yml", wait=True)
    try:
        wait_until(lambda: len(changed(fleet, "a")) == len(HOSTS), "the first run to reach its gate")
        rc, out = finish(start(fleet, "b", playbook="unlocked.yml"))
        assert rc == 0 and changed(fleet, "b") == sorted(HOSTS), out
    finally:
        (fleet / "go-a").touch()
        finish(first)


def test_the_lock_of_a_run_that_died_is_taken_over_from_the_same_controller(fleet):
    first = start(fleet, "a", wait=True)
    wait_until(lambda: len(changed(fleet, "a")) == len(HOSTS), "the first run to reach its gate")
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate(timeout=60)
    dead = holders(fleet)["vllm-1"]["run_id"]
    rc, out = finish(start(fleet, "b"))
    assert rc == 0, out
    assert f"taking over the run lock of run {dead}" in out and "that ansible-playbook process has ended" in out, out
    assert holders(fleet) == FREE, out


def other_controllers_lock(fleet, hosts):
    lock = {
        "run_id": "20261127T010000Z-ctl-b-4242",
        "owner": "ops@ctl-b",
        "controller": "ctl-b",
        "machine_id": "another-machine",
        "pid": 4242,
        "pid_start": "123",
        "playbook": "upgrade.yml",
        "started": "2026-11-27T01:00:00Z",
        "lease_until": "2026-11-27T07:00:00Z",
    }
    for name in hosts:
        (fleet / name).mkdir(exist_ok=True)
        (fleet / name / "run.lock").write_text(json.dumps(lock))
    return lock


def test_another_controllers_lock_needs_the_break_flag_and_partial_locks_are_given_back(fleet):
    lock = other_controllers_lock(fleet, ["vllm-2"])
    rc, out = finish(start(fleet, "b"))
    assert rc != 0, out
    assert f"vllm-2: the run lock is held by run {lock['run_id']} (ops@ctl-b" in out, out
    assert "it ran on another controller" in out and f"-e vllm_fleet_break_lock={lock['run_id']}" in out, out
    assert changed(fleet, "b") == [], out
    # The hosts this run did lock are free again; the other run's lock is as it was.
    assert holders(fleet) == {"vllm-1": {}, "vllm-2": lock, "lb-1": {}}, out

    rc, out = finish(start(fleet, "c", "-e", "vllm_fleet_break_lock=20261127T000000Z-other-1"))
    assert rc != 0 and changed(fleet, "c") == [], "a break flag naming another run broke the lock"

    rc, out = finish(start(fleet, "d", "-e", f"vllm_fleet_break_lock={lock['run_id']}"))
    assert rc == 0 and changed(fleet, "d") == sorted(HOSTS), out
    assert "vllm_fleet_break_lock names it" in out, out
    assert holders(fleet) == FREE, out
