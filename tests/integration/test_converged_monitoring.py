"""A monitoring host keeps a converged record like every other host (issue 42): a re-run with the same inputs skips
it, and what it reads of the hosts it watches beyond their own digests (a host's monitoring knobs, such as its
host_class label on every target) converges the monitoring host alone. Through the real preflight action on
controller-local hosts (test_preflight's fleet); the records are written as converged_record.yml writes them, with
no witnesses (the roles do not run here)."""

import pytest
from test_preflight import controller_inputs, recap, run_preflight  # noqa: F401  # pylint: disable=unused-import

RECORD = """---
- name: Preflight
  ansible.builtin.import_playbook: vllm.cpu_fleet.preflight

- name: Record each host as converged_record.yml does, without the roles' witnesses
  hosts: vllm_hosts:monitoring
  gather_facts: false
  tasks:
    - name: Write the record
      vllm.cpu_fleet.vllm_converged:
        path: "{{ vllm_fleet_converged_inputs.record }}"
        inputs: "{{ vllm_fleet_converged.inputs }}"
        witness: {}
"""


def decisions(output):
    """{host: the decision task's label} ("skipped, ..." or "converging: ...")."""
    found = {}
    for line in output.splitlines():
        if "=> (item=" in line and (": skipped, " in line or ": converging: " in line):
            label = line.split("=> (item=", 1)[1].rstrip(")")
            host, said = label.split(": ", 1)
            found[host] = said
    return found


@pytest.fixture
def fleet(tmp_path_factory):
    records = tmp_path_factory.mktemp("records")
    scrape = {"monitoring_target_address_var": "scrape_address", "scrape_address": "127.0.0.1"}
    record = {"vllm_fleet_converged_record": str(records) + "/{{ inventory_hostname }}.json"}
    hosts = {"good-1": {**scrape, **record}, "good-2": {**scrape, **record}}
    monitoring = {"mon-1": {**scrape, **record}}
    return hosts, monitoring


def test_a_recorded_monitoring_host_is_skipped_and_a_watched_knob_converges_it_alone(
    tmp_path, machine_root, controller_inputs, fleet  # noqa: F811 (the fixture imported above)
):
    hosts, monitoring = fleet
    playbook = tmp_path.parent / f"{tmp_path.name}-record.yml"
    playbook.write_text(RECORD)

    first = run_preflight(tmp_path, machine_root, controller_inputs, hosts, monitoring=monitoring, playbook=playbook)
    assert first.returncode == 0, first.stdout[-3000:]
    assert decisions(first.stdout) == dict.fromkeys(["good-1", "good-2", "mon-1"], "converging: no converged record")

    again = run_preflight(tmp_path, machine_root, controller_inputs, hosts, monitoring=monitoring)
    assert again.returncode == 0, again.stdout[-3000:]
    unchanged = "skipped, unchanged since the last run"
    assert decisions(again.stdout) == dict.fromkeys(["good-1", "good-2", "mon-1"], unchanged)
    assert all(stats["changed"] == 0 for stats in recap(again.stdout).values())

    # good-1's targets get another host_class label: only the monitoring host's files change.
    hosts["good-1"]["monitoring_host_class"] = "canary"
    moved = run_preflight(tmp_path, machine_root, controller_inputs, hosts, monitoring=monitoring)
    assert moved.returncode == 0, moved.stdout[-3000:]
    assert decisions(moved.stdout) == {
        "good-1": "skipped, unchanged since the last run",
        "good-2": "skipped, unchanged since the last run",
        "mon-1": "converging: inputs of its peers changed since the last run: good-1",
    }
