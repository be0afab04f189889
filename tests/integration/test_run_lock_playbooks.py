"""The run lock through ansible-playbook (review day2-edges, finding 7): a second run started while the first
changes the fleet stops before any change, naming the holder; a run whose ansible-playbook ended is taken over
from the same controller; a lock from another controller needs vllm_fleet_break_lock; two runs that each took some
hosts give them back.

The playbook is the real playbooks/run_lock.yml, a play standing for the run's changes (it writes a marker per
host, and waits for a file when asked, as a run waits in a health gate), then the real playbooks/run_unlock.yml,
on local hosts whose lock files live in the test's directory. The negative control runs the same two runs without
run_lock.yml: the second changes the hosts while the first is still in its "gate".

Under --limit (issue 41, review day2-fleet-shape N2), a run still locks every load balancer its rollout drains on,
by delegation: two runs limited to different hosts cannot drain them at once. A lock run that cannot take every
lock (held by another run, a host unreachable, a lock file it cannot read) gives back what it took, never another
run's lock (N3): left behind, its locks refused every next job from AWX.
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


UNREACHABLE = {
    "ansible_connection": "ssh",
    "ansible_host": "192.0.2.1",  # TEST-NET-1: never answers
    "ansible_ssh_common_args": "-o ConnectTimeout=2 -o BatchMode=yes",
}


def build_fleet(tmp_path, lbs=("lb-1",), monitoring=(), unreachable=()):
    """Two vLLM hosts behind `lbs`, with `monitoring` hosts; the hosts in `unreachable` never answer."""
    names = (*HOSTS[:2], *lbs, *monitoring)
    hosts = {name: {"vllm_fleet_run_lock": str(tmp_path / name / "run.lock")} for name in names}
    for name in unreachable:
        hosts[name].update(UNREACHABLE)
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "vllm_hosts": {"hosts": {n: hosts[n] for n in HOSTS[:2]}},
                "loadbalancers": {"hosts": {n: hosts[n] for n in lbs}},
                "builders": {"hosts": {}},
                "monitoring": {"hosts": {n: hosts[n] for n in monitoring}},
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


@pytest.fixture
def fleet(tmp_path):
    return build_fleet(tmp_path)


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


def holders(fleet, names=HOSTS):
    out = {}
    for name in names:
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


@pytest.mark.parametrize("lbs", [("lb-1",), ("lb-1", "lb-2")], ids=["one-lb", "two-lbs"])
def test_two_runs_limited_to_different_hosts_the_second_stops_at_the_load_balancers(tmp_path, lbs):
    fleet = build_fleet(tmp_path, lbs=lbs)
    names = (*HOSTS[:2], *lbs)
    first = start(fleet, "a", "--limit", "vllm-1", wait=True)
    try:
        wait_until(lambda: changed(fleet, "a") == ["vllm-1"], "the first run to reach its gate")
        held = holders(fleet, names)
        run_id = held["vllm-1"]["run_id"]
        # --limit leaves the load balancers out of the play; the rollout drains vllm-1 on each: all are locked.
        assert {name: lock.get("run_id") for name, lock in held.items()} == {
            "vllm-1": run_id, "vllm-2": None, **dict.fromkeys(lbs, run_id)
        }, held  # fmt: skip
        rc, out = finish(start(fleet, "b", "--limit", "vllm-2"))
        assert rc != 0, out
        assert changed(fleet, "b") == [], f"the second run changed vllm-2 while the first drains vllm-1:\n{out}"
        for lb in lbs:
            assert f"{lb}: the run lock is held by run {run_id} (" in out, out
        assert "RUN LOCKED: lb-1: " in out and f"ansible-playbook pid {first.pid} on " in out, out
        assert f"site.yml) since {held['lb-1']['started']}" in out, out
        assert f"-e vllm_fleet_break_lock={run_id}" in out, out
        # Refused half-way: the second run took vllm-2, then gave it back; the first run's locks are as they were.
        assert (fleet / "vllm-2" / "run.lock").exists(), out
        assert holders(fleet, names) == held, out
    finally:
        (fleet / "go-a").touch()
    rc, out = finish(first)
    assert rc == 0, out
    assert holders(fleet, names) == {name: {} for name in names}, f"the first run kept a lock:\n{out}"
    rc, out = finish(start(fleet, "c", "--limit", "vllm-2"))
    assert rc == 0 and changed(fleet, "c") == ["vllm-2"], out


def test_a_lock_run_that_loses_a_host_gives_back_the_locks_it_took(tmp_path):
    fleet = build_fleet(tmp_path, monitoring=("mon-1",), unreachable=("mon-1",))
    rc, out = finish(start(fleet, "b"))
    assert rc != 0 and changed(fleet, "b") == [], out
    # Each was taken, then given back: the next job (from AWX, another pid namespace) is not refused.
    assert all((fleet / name / "run.lock").exists() for name in HOSTS), out
    assert holders(fleet) == FREE, f"the failed lock run left its locks behind:\n{out}"
    assert "RUN LOCKED: mon-1: vllm_fleet_run_lock: this run lost the host before it held its run lock" in out, out


def test_a_lock_run_that_cannot_read_a_lock_gives_back_the_others_and_leaves_that_file(fleet):
    (fleet / "vllm-2").mkdir()
    (fleet / "vllm-2" / "run.lock").write_text("not a lock\n")
    rc, out = finish(start(fleet, "b"))
    assert rc != 0 and changed(fleet, "b") == [], out
    assert (fleet / "lb-1" / "run.lock").exists(), out
    assert holders(fleet, ["vllm-1", "lb-1"]) == {"vllm-1": {}, "lb-1": {}}, (
        f"the failed lock run kept its locks:\n{out}"
    )
    assert (fleet / "vllm-2" / "run.lock").read_text() == "not a lock\n", out
    assert f"RUN LOCKED: vllm-2: vllm_fleet_run_lock: {fleet}/vllm-2/run.lock: not a run lock" in out, out
    assert "fix: remove it if no run is changing this host" in out, out


def test_a_limited_run_stops_when_a_load_balancer_outside_the_limit_cannot_be_locked(tmp_path):
    fleet = build_fleet(tmp_path, unreachable=("lb-1",))
    rc, out = finish(start(fleet, "b", "--limit", "vllm-1"))
    assert rc != 0 and changed(fleet, "b") == [], out
    assert (fleet / "vllm-1" / "run.lock").exists() and holders(fleet, ["vllm-1"]) == {"vllm-1": {}}, out
    assert "RUN LOCKED: lb-1: vllm_fleet_run_lock: this run could not reach this load balancer, which the" in out, out


def test_a_run_that_holds_every_lock_ends_the_lock_play_without_a_task_of_each_host(fleet):
    """Issue 41 (preflight at fleet scale): when the run holds every lock, the check says so once and the play ends
    (meta end_play), so no host runs, or skips, the give-back tasks of the failure path: two tasks of each host."""
    rc, out = finish(start(fleet, "a"))
    assert rc == 0 and changed(fleet, "a") == ["lb-1", "vllm-1", "vllm-2"], out
    assert "holds the run lock on 3 host(s)." in out, out
    assert "TASK [End the play when this run holds the lock on every host]" in out, out
    assert "Give back the locks this run took" not in out, f"every host went through the give-back tasks:\n{out}"


def test_the_vllm_fleet_arguments_are_checked_unless_this_runs_preflight_checked_them(fleet):
    """Without preflight (run_lock.yml alone, playbooks/decommission.yml), the role's argument check refuses a value
    outside its spec before any lock is taken; after preflight (preflight_fleet registered on every host), which
    types the same variables of the same hosts, the check is not repeated by a task of each host."""
    rc, out = finish(start(fleet, "a", "-e", "vllm_install_source=bogus"))
    assert rc != 0 and changed(fleet, "a") == [], out
    assert "Validation of arguments failed" in out and "vllm_install_source" in out, out
    assert holders(fleet) == {name: {} for name in HOSTS} and not any((fleet / n).exists() for n in HOSTS), out
    rc, out = finish(start(fleet, "b", "-e", '{"preflight_fleet": {"fleet": {}}}'))
    assert rc == 0 and changed(fleet, "b") == ["lb-1", "vllm-1", "vllm-2"], out
    assert "Validation of arguments failed" not in out, out
    assert "skipping: [vllm-1]" in out.split("Validating arguments against arg spec 'main'")[1].split("TASK [")[0], out
