"""Job slicing, what can be proven without containers: the facts-and-plan part of
site.yml (playbooks/preflight.yml) run as two slices, one after the other, gives
every host the plan one run over the whole fleet gives, whether the slices are
--limit runs or inventories cut as AWX / Automation Platform cuts them (each
slice's inventory holds only its hosts); and a load balancer in a --limit slice
stops in preflight instead of losing the backends outside it.

The hosts are benchmarks/fleet_scale.py's fake hosts: this controller
(ansible_connection=local) reading one of five recorded machines each.
"""

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import fleet_scale

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
HOSTS = 6


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("slicing")
    inventory = fleet_scale.inventory(HOSTS, work)
    playbook = work / "plan.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {"ansible.builtin.import_playbook": str(REPO / "playbooks" / "preflight.yml")},
                {
                    "name": "Write each host's plan",
                    "hosts": "vllm_hosts",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Write the plan",
                            "ansible.builtin.copy": {
                                "content": "{{ vllm_plan | to_json }}",
                                "dest": "{{ plans_dir }}/{{ inventory_hostname }}.json",
                                "mode": "0644",
                            },
                        }
                    ],
                },
            ]
        )
    )
    return {"work": work, "inventory": inventory, "playbook": playbook}


def write_inventory(path, inventory):
    path.write_text(yaml.safe_dump(inventory))
    return path


def run(fleet, inventory_path, plans_dir, *args):
    plans_dir.mkdir(exist_ok=True)
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(inventory_path), str(fleet["playbook"]), "-e", f"plans_dir={plans_dir}", *args],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_FORKS": "6", "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"},
        capture_output=True,
        text=True,
        timeout=900, check=False,
    )


def plans(plans_dir):
    return {path.stem: json.loads(path.read_text()) for path in sorted(plans_dir.glob("*.json"))}


def awx_slice(inventory, number, count):
    """The inventory of slice ``number`` (1-based) of ``count``, cut as AWX cuts it: every count-th host, and each
    group keeps only those hosts."""
    hosts = sorted(
        host for group in inventory["all"]["children"]["vllm_hosts"]["children"].values() for host in group["hosts"]
    )
    keep = set(hosts[number - 1 :: count])
    sliced = copy.deepcopy(inventory)
    for group in sliced["all"]["children"]["vllm_hosts"]["children"].values():
        group["hosts"] = {host: value for host, value in group["hosts"].items() if host in keep}
    return sliced, keep


def test_two_slices_plan_every_host_as_one_run_does(fleet):
    work, inventory = fleet["work"], fleet["inventory"]
    whole_inventory = write_inventory(work / "inventory.yml", inventory)
    one_run = run(fleet, whole_inventory, work / "one-run")
    assert one_run.returncode == 0, one_run.stdout[-3000:]
    expected = plans(work / "one-run")
    assert len(expected) == HOSTS

    hosts = sorted(expected)
    for number, hosts_of_slice in enumerate((hosts[0::2], hosts[1::2]), 1):
        result = run(fleet, whole_inventory, work / "limit-slices", "--limit", ",".join(hosts_of_slice))
        assert result.returncode == 0, result.stdout[-3000:]
        passed = f"Preflight passed on {len(hosts_of_slice)} host(s)."
        assert passed in result.stdout, "the gate did not run under --limit"
        assert set(plans(work / "limit-slices")) >= set(hosts_of_slice), number
    assert plans(work / "limit-slices") == expected

    for number in (1, 2):
        sliced, keep = awx_slice(inventory, number, 2)
        result = run(fleet, write_inventory(work / f"slice-{number}.yml", sliced), work / "awx-slices")
        assert result.returncode == 0, result.stdout[-3000:]
        assert f"Preflight passed on {len(keep)} host(s)." in result.stdout
    assert plans(work / "awx-slices") == expected


def test_a_load_balancer_in_a_limit_slice_stops_before_it_loses_the_other_backends(fleet):
    work, inventory = fleet["work"], copy.deepcopy(fleet["inventory"])
    inventory["all"]["children"]["loadbalancers"] = {"hosts": {"lb": {}}}
    inventory["all"]["vars"]["loadbalancer_plain_http"] = True
    path = write_inventory(work / "inventory-lb.yml", inventory)
    result = run(fleet, path, work / "lb-slice", "--limit", "lb,h0000,h0002")
    assert result.returncode != 0
    found = re.search(r"lb: ([h0-9, ]+) in group 'vllm_hosts' have no vllm_plan with instances", result.stdout)
    assert found, result.stdout[-3000:]
    assert set(found.group(1).split(", ")) == {"h0001", "h0003", "h0004", "h0005"}
    # Every load balancer failed, so the run ended there: no play after preflight ran on any host.
    assert "TASK [Write the plan]" not in result.stdout


def test_the_preflight_gate_stops_a_limit_slice_too(fleet):
    # localhost is never in a --limit slice: a gate there would not run, and the hosts that passed would go on.
    work, inventory = fleet["work"], copy.deepcopy(fleet["inventory"])
    classes = inventory["all"]["children"]["vllm_hosts"]["children"]
    (bad_class,) = [group for group in classes.values() if "h0001" in group["hosts"]]
    bad_class["hosts"]["h0001"] = {"vllm_plan_tp": 6}
    path = write_inventory(work / "inventory-bad.yml", inventory)
    result = run(fleet, path, work / "bad-slice", "--limit", "h0000,h0001")
    assert result.returncode != 0
    assert "h0001: vllm_plan_tp" in result.stdout
    assert "Preflight failed on h0001 (their messages are above); nothing was changed" in result.stdout
    assert "TASK [Write the plan]" not in result.stdout, "a host went on past a failed preflight"


def test_a_load_balancer_in_an_awx_slice_stops_before_it_empties_the_backend(fleet):
    # In an AWX slice the other hosts are not in the inventory at all: only the backend HAProxy runs now knows them.
    work, inventory = fleet["work"], copy.deepcopy(fleet["inventory"])
    inventory["all"]["children"]["loadbalancers"] = {"hosts": {"lb": {}}}
    inventory["all"]["vars"]["loadbalancer_plain_http"] = True
    config = work / "haproxy.cfg"
    first = run(
        fleet,
        write_inventory(work / "inventory-awx-lb.yml", inventory),
        work / "awx-lb-plans",
        "-e",
        f"loadbalancer_haproxy_config={config}",
    )
    assert first.returncode == 0, first.stdout[-3000:]  # no configuration yet: nothing to compare with
    servers = {
        host: [f"{host}-{instance['name']}" for instance in plan["instances"]]
        for host, plan in plans(work / "awx-lb-plans").items()
    }
    lines = [f"    server {name} 10.0.0.{n}:8000" for n, names in enumerate(servers.values()) for name in names]
    config.write_text(
        "frontend api\n    default_backend vllm\n\nbackend vllm\n    balance leastconn\n" + "\n".join(lines) + "\n"
    )

    sliced, keep = awx_slice(inventory, 1, 2)
    result = run(
        fleet,
        write_inventory(work / "awx-lb-slice.yml", sliced),
        work / "awx-lb-slice",
        "-e",
        f"loadbalancer_haproxy_config={config}",
    )
    assert result.returncode != 0
    found = re.search(
        r"lb: loadbalancer_backend_group: this run would take (\d+) of the (\d+) servers .*?\(([^)]*)\)", result.stdout
    )
    assert found, result.stdout[-3000:]
    removed = sorted(name for host in servers if host not in keep for name in servers[host])
    assert (int(found.group(1)), int(found.group(2))) == (len(removed), len(lines))
    assert sorted(found.group(3).split(", ")) == removed
    assert "TASK [Write the plan]" not in result.stdout

    # The whole fleet again passes; so does the slice when retiring hosts is meant.
    again = run(
        fleet,
        write_inventory(work / "inventory-awx-lb.yml", inventory),
        work / "awx-lb-plans",
        "-e",
        f"loadbalancer_haproxy_config={config}",
    )
    assert again.returncode == 0, again.stdout[-3000:]
    meant = run(
        fleet,
        work / "awx-lb-slice.yml",
        work / "awx-lb-slice",
        "-e",
        f"loadbalancer_haproxy_config={config}",
        "-e",
        "loadbalancer_max_removed_servers_percent=100",
    )
    assert meant.returncode == 0, meant.stdout[-3000:]
