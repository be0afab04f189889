"""Preflight at fleet scale: what every host's checks read of the other hosts is read once for the run.

Each hostvars[host] builds that host's whole variable set; a host that walks every other host's variables makes the
run's controller cost grow with the square of the fleet (benchmarks/fleet_scale.py, docs/benchmarks.md).
"""

import time
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleUndefinedVariable
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible_collections.vllm.cpu_fleet.plugins.action import vllm_preflight as action

REPO = Path(__file__).resolve().parents[2]


class CountingHostvars(dict):
    """hostvars that counts each host's variables built (Ansible's HostVars templates them at every lookup)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.reads = 0

    def __getitem__(self, name):
        self.reads += 1
        value = super().__getitem__(name)
        if isinstance(value, Exception):
            raise value
        return value


def _fleet(n, container=None):
    hosts = [f"h{i:04d}" for i in range(n)]
    hostvars = CountingHostvars(
        {name: {"vllm_service_mode": "container" if name == container else "venv"} for name in hosts}
    )
    return {"vllm_hosts": hosts, "builders": []}, hostvars


def _sections(host, groups, hostvars, fleet):
    task_vars = {"groups": groups, "hostvars": hostvars, "vllm_install_source": "wheel"}
    merged = action.ActionModule._variables(task_vars, [])
    templar = Templar(loader=DataLoader(), variables={}).copy_with_new_env(available_variables=merged)

    class Self:
        _fleet_values = fleet

    return action.ActionModule._sections(Self, host, task_vars, merged, templar)


def test_the_fleet_is_read_once_and_each_host_reads_no_other_hosts_variables():
    groups, hostvars = _fleet(200, container="h0199")
    before = int(time.time() // 86400)
    fleet = action.ActionModule._fleet({"groups": groups, "hostvars": hostvars})
    # The run's day, read once for every host (the image base's refresh period): today's, as UTC counts it.
    assert fleet == {"containers": True, "run_day": fleet["run_day"]}
    assert before <= fleet["run_day"] <= int(time.time() // 86400)
    assert hostvars.reads == 200
    for host in groups["vllm_hosts"]:
        assert "container" in _sections(host, groups, hostvars, fleet)
    # 200 hosts' sections decided from the run's one read: not one more lookup (before: 200 x 200).
    assert hostvars.reads == 200


def test_the_sections_are_the_same_with_the_fleet_passed_in_or_read_by_the_host():
    for container in (None, "h0000", "h0009"):
        groups, hostvars = _fleet(10, container=container)
        fleet = action.ActionModule._fleet({"groups": groups, "hostvars": hostvars})
        assert fleet["containers"] is (container is not None)
        for host in groups["vllm_hosts"]:
            assert _sections(host, groups, hostvars, fleet) == _sections(host, groups, hostvars, None)


def test_a_host_whose_variables_do_not_render_counts_for_no_container():
    groups, hostvars = _fleet(3, container="h0002")
    hostvars["h0001"] = AnsibleUndefinedVariable("'nowhere' is undefined")
    del hostvars["h0000"]
    assert action.ActionModule._fleet({"groups": groups, "hostvars": hostvars})["containers"] is True
    groups, hostvars = _fleet(2)
    hostvars["h0001"] = AnsibleUndefinedVariable("'nowhere' is undefined")
    assert action.ActionModule._fleet({"groups": groups, "hostvars": hostvars})["containers"] is False


def test_the_preflight_play_reads_the_fleet_once_and_passes_it_to_every_host():
    play = yaml.safe_load((REPO / "playbooks" / "preflight.yml").read_text())[0]
    once, each = play["tasks"][:2]
    assert once["vllm.cpu_fleet.vllm_preflight"] == {"fleet_only": True}
    assert once["run_once"] is True
    assert each["vllm.cpu_fleet.vllm_preflight"]["fleet"] == "{{ " + once["register"] + ".fleet }}"


def _tasks(tasks):
    for task in tasks:
        yield task
        for part in ("block", "rescue", "always"):
            yield from _tasks(task.get(part, []))


@pytest.mark.parametrize("playbook", ["run_lock.yml", "run_unlock.yml"])
def test_the_run_lock_plays_template_each_fleet_wide_value_once_before_any_host_task_reads_it(playbook):
    """The run lock plays' vars read every host of the play (hostvars): read by a run_once task only, or pinned by
    a run_once set_fact; no task of every host templates them again (a `when` does not stop a loop's templating)."""
    play = yaml.safe_load((REPO / "playbooks" / playbook).read_text())[0]
    fleet_wide = {name for name, value in play["vars"].items() if "hostvars" in str(value)}
    assert fleet_wide
    # The values that read other values which read hostvars.
    fleet_wide |= {"run_lock_stop", "run_lock_lb_held"} & set(play["vars"])
    pinned = set()
    for task in _tasks(play["tasks"]):
        if task.get("run_once") and "ansible.builtin.set_fact" in task:
            facts = task["ansible.builtin.set_fact"]
            assert all(value == "{{ " + name + " }}" for name, value in facts.items())
            pinned |= set(facts)
            continue
        if task.get("run_once") or "block" in task:
            continue
        text = yaml.safe_dump({k: v for k, v in task.items() if k != "name"})
        read = {name for name in fleet_wide if name in text}
        assert read <= pinned, f"{task['name']}: reads {sorted(read - pinned)} before a run_once task pins it"
    if playbook == "run_lock.yml":
        assert {"run_lock_delegated", "run_lock_runner", "run_lock_stop", "run_lock_lb_held"} <= pinned
