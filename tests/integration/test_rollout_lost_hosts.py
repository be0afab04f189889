"""A host lost mid-batch stops the rollout (review day2-edges, finding 2), through ansible-playbook itself.

ansible-core's max_fail_percentage counts failed hosts only, and a batch goes on when only some of its hosts are
unreachable: a host that dies in a batch of two or more (or whose load balancer dies under delegate_to) was
dropped and the next batches and plays ran. The rollout play runs roles/rollout/tasks/lost_hosts.yml before every
batch and once after the last (playbooks/rollout.yml). Each scenario runs a play shaped like the rollout's (serial,
max_fail_percentage 0, the guard first, then a change that writes a marker per host) on local hosts, one of them
unreachable (an address in TEST-NET-1), then the final guard play and a later play; the markers show which hosts
were changed and whether the later play ran. The last test is the negative control: the same run without the guard
changes the later batches, so the scenarios can fail.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
ENV = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_RETRY_FILES_ENABLED="0")
HOSTS = [f"h{i}" for i in range(1, 7)]
UNREACHABLE = {
    "ansible_connection": "ssh",
    "ansible_host": "192.0.2.1",  # TEST-NET-1: never answers
    "ansible_ssh_common_args": "-o ConnectTimeout=2 -o BatchMode=yes",
}
GUARD = {"name": "vllm.cpu_fleet.rollout", "tasks_from": "lost_hosts"}
BEFORE = "before the batch of {{ ansible_play_batch | join(', ') }}"
MARK = "{{{{ marks }}}}/{}-{{{{ inventory_hostname }}}}"


def run(tmp, serial, lost=None, lost_lb_of=None, guard=True):
    """Run the rollout-shaped playbook; returns (rc, output, hosts changed, whether the later play ran)."""
    hosts = {name: {} for name in HOSTS}
    if lost:
        hosts[lost] = dict(UNREACHABLE)
    hosts["lb"] = dict(UNREACHABLE)
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "marks": str(tmp)},
            "children": {
                "vllm_hosts": {"hosts": {name: hosts[name] for name in HOSTS}},
                "loadbalancers": {"hosts": {"lb": hosts["lb"]}},
            },
        }
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    guard_task = {"name": "Guard", "ansible.builtin.include_role": GUARD, "vars": {"rollout_lost_where": BEFORE}}
    guard = [guard_task] if guard else []
    batches = {
        "hosts": "vllm_hosts",
        "serial": serial,
        "max_fail_percentage": 0,
        "gather_facts": False,
        "tasks": [
            *guard,
            {
                "name": "Drain on the load balancer",
                "ansible.builtin.command": "true",
                "delegate_to": "lb",
                "changed_when": False,
                "when": f"inventory_hostname == {lost_lb_of!r}",
            },
            {"name": "Change the host", "ansible.builtin.file": {"path": MARK.format("changed"), "state": "touch"}},
        ],
    }
    final = {
        "hosts": "vllm_hosts",
        "gather_facts": False,
        "tasks": [{"ansible.builtin.include_role": GUARD, "vars": {"rollout_lost_where": "after the last batch"}}],
    }
    later_play = {
        "hosts": "vllm_hosts",
        "gather_facts": False,
        "tasks": [{"ansible.builtin.file": {"path": MARK.format("later"), "state": "touch"}}],
    }
    (tmp / "play.yml").write_text(yaml.safe_dump([batches, *([final] if guard else []), later_play], sort_keys=False))
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp / "inventory.yml"), str(tmp / "play.yml")],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    changed = sorted(p.name.removeprefix("changed-") for p in tmp.glob("changed-*"))
    later = sorted(p.name.removeprefix("later-") for p in tmp.glob("later-*"))
    return proc.returncode, proc.stdout + proc.stderr, changed, later


def test_every_batch_runs_when_no_host_is_lost(tmp_path):
    rc, output, changed, later = run(tmp_path, serial=2)
    assert rc == 0, output
    assert changed == HOSTS and later == HOSTS, output


def test_a_host_lost_in_a_batch_of_two_stops_the_next_batches_and_plays(tmp_path):
    rc, output, changed, later = run(tmp_path, serial=2, lost="h2")
    assert rc != 0, output
    assert changed == ["h1"], f"batches after the lost host ran: {changed}\n{output}"
    assert later == [], f"a later play ran: {later}\n{output}"
    assert "ROLLOUT STOPPED before the batch of h3, h4: h2 left this run" in output, output


def test_a_load_balancer_lost_under_delegate_to_stops_the_run(tmp_path):
    # h3's drain is delegated to the dead load balancer: Ansible marks h3 unreachable.
    rc, output, changed, later = run(tmp_path, serial=2, lost_lb_of="h3")
    assert rc != 0, output
    assert changed == ["h1", "h2", "h4"], output
    assert later == [], output
    assert "ROLLOUT STOPPED before the batch of h5, h6: h3 left this run" in output, output


def test_a_host_lost_in_the_last_batch_stops_the_later_plays(tmp_path):
    rc, output, changed, later = run(tmp_path, serial=2, lost="h6")
    assert rc != 0, output
    assert changed == ["h1", "h2", "h3", "h4", "h5"], output
    assert later == [], f"a play after the rollout ran: {later}\n{output}"
    assert "ROLLOUT STOPPED after the last batch: h6 left this run" in output, output


@pytest.mark.parametrize("lost", ["h2", "h6"])
def test_negative_control_without_the_guard_the_run_goes_on(tmp_path, lost):
    """What ansible-core does alone: the scenarios above would fail without roles/rollout/tasks/lost_hosts.yml."""
    _unused, output, changed, later = run(tmp_path, serial=2, lost=lost, guard=False)
    others = [host for host in HOSTS if host != lost]
    assert changed == others, output
    assert later == others, output


def test_the_rollout_play_runs_the_guard_before_each_batch_and_after_the_last():
    plays = yaml.safe_load((REPO / "playbooks" / "rollout.yml").read_text())
    batches = next(play for play in plays if "serial" in play)
    assert batches["max_fail_percentage"] == 0
    assert batches["roles"] == [{"role": "vllm.cpu_fleet.rollout"}]
    first = yaml.safe_load((REPO / "roles" / "rollout" / "tasks" / "main.yml").read_text())[0]
    assert first["ansible.builtin.include_tasks"] == "lost_hosts.yml"
    last = plays[-1]["tasks"][0]["ansible.builtin.include_role"]
    assert last == {"name": "vllm.cpu_fleet.rollout", "tasks_from": "lost_hosts"}
