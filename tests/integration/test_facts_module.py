"""Run vllm_cpu_facts through the real ansible CLI with the project's ansible.cfg."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, load_expected_facts

BIN = Path(sys.executable).parent
# Ad-hoc output is "host | STATUS => {json}"; force JSON over ansible.cfg's yaml.
ENV = dict(os.environ, ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")


def run_module(*args, module="vllm.cpu_fleet.vllm_cpu_facts", inside=()):
    """(rc, status, result) of one ad-hoc run on localhost; inside: a command to run it under (ip netns exec NS)."""
    proc = subprocess.run(
        [*inside, str(BIN / "ansible"), "localhost", "-m", module, *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120, check=False,
    )
    status, sep, payload = proc.stdout.partition(" => ")
    assert sep, f"no result in ansible output:\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, status.split("|")[-1].strip(), json.loads(payload)


@pytest.mark.parametrize("name", ["gnr-2s-snc3", "milan-container-cpuset", "graviton3-c7g"])
def test_module_returns_fixture_facts(machine_root, name):
    rc, status, result = run_module("-a", f"root={machine_root(name)}")
    assert (rc, status, result["changed"]) == (0, "SUCCESS", False)
    assert result["ansible_facts"]["vllm_cpu"] == load_expected_facts(name)


def test_module_check_mode_on_this_host():
    rc, status, result = run_module("--check")
    assert (rc, status) == (0, "SUCCESS")
    facts = result["ansible_facts"]["vllm_cpu"]
    # The local connection inherits this process's affinity, which the kernel
    # already keeps within the cgroup cpuset and the online CPUs.
    assert facts["allowed_cpus"] == sorted(os.sched_getaffinity(0))
    recorded = load_expected_facts("local-xeon-2cpu")
    if facts["model"] == recorded["model"]:
        # Running on the recorded machine: everything but hot-plugged memory must agree.
        for key in ("arch", "vendor", "isa", "isa_class", "sockets", "threads_per_core", "online_cpus", "cgroup"):
            assert facts[key] == recorded[key], key


def test_module_os_facts_are_setups():
    # The roles read these instead of running setup: they must be setup's own values.
    _unused, _unused, ours = run_module()
    _unused, status, theirs = run_module("-a", "gather_subset=!all,!min,distribution,python,platform", module="setup")
    assert status == "SUCCESS"
    os_facts = {key: value for key, value in ours["ansible_facts"].items() if key not in ("vllm_cpu", "vllm_cpu_key")}
    for key in ("distribution", "distribution_major_version", "distribution_version", "os_family", "architecture"):
        assert key in os_facts, key
    assert os_facts["python"]["executable"]
    assert os_facts == {key: theirs["ansible_facts"]["ansible_" + key] for key in os_facts}


def test_module_returns_setups_network_and_systemd_facts_when_asked():
    # Preflight reads them in the facts run instead of a second (setup) run per serving host.
    _unused, _unused, ours = run_module("-a", "gather_subset=network,systemd")
    _unused, status, theirs = run_module("-a", "gather_subset=!all,!min,network,systemd", module="setup")
    assert status == "SUCCESS"
    expected = {key.removeprefix("ansible_"): value for key, value in theirs["ansible_facts"].items()}
    assert "all_ipv4_addresses" in expected
    got = {key: ours["ansible_facts"].get(key) for key in expected}
    # setup lists the interfaces in the order a set of them iterates, which varies between runs.
    got["interfaces"], expected["interfaces"] = sorted(got["interfaces"]), sorted(expected["interfaces"])
    assert got == expected


def test_module_confirms_a_cached_key_without_reading_the_facts_again():
    _unused, _unused, first = run_module()
    key = first["ansible_facts"]["vllm_cpu_key"]
    assert first["cached"] is False
    rc, status, again = run_module("-a", f"cache_key={key}")
    assert (rc, status, again["cached"]) == (0, "SUCCESS", True)
    assert again["ansible_facts"]["vllm_cpu_key"] == key and "vllm_cpu" not in again["ansible_facts"]
    _unused, _unused, other = run_module("-a", "cache_key=stale")
    assert other["cached"] is False and other["ansible_facts"]["vllm_cpu"] == first["ansible_facts"]["vllm_cpu"]


def test_module_failure_names_the_path(tmp_path):
    rc, status, result = run_module("-a", f"root={tmp_path}")
    assert (rc, status) == (2, "FAILED!")
    assert result["path"] == str(tmp_path / "proc" / "cpuinfo")
    assert str(tmp_path / "proc" / "cpuinfo") in result["msg"]


def test_ansible_doc_renders():
    proc = subprocess.run(
        [str(BIN / "ansible-doc"), "vllm.cpu_fleet.vllm_cpu_facts"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "numa_nodes" in proc.stdout and "isa_class" in proc.stdout
