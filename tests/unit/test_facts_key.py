"""facts_key: the digest vllm_cpu_facts compares with a cached key. It must change
whenever read_cpu_facts could return something else without a reboot, and stay
put otherwise (or the cache never hits)."""

import os
import re

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_topology import (
    KEY_FILES,
    facts_key,
    read_cpu_facts,
)
from ansible_collections.vllm.cpu_fleet.tests.conftest import MACHINE_NAMES

# Files read_cpu_facts reads that only change with the hardware, the firmware's
# NUMA setting or the kernel: all of them take a reboot, which the boot id in
# KEY_FILES catches.
HARDWARE_ONLY = re.compile(
    r"proc/cpuinfo"
    r"|sys/devices/system/cpu/cpu[0-9]+/topology/\w+"
    r"|sys/devices/system/node/node[0-9]+/(cpulist|distance)"
)
NODE_MEMINFO = re.compile(r"sys/devices/system/node/node[0-9]+/meminfo")
HEALTHY = [name for name in MACHINE_NAMES if not name.startswith("corrupt-")]


def write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("name", HEALTHY)
def test_every_file_the_facts_read_is_in_the_key_or_needs_a_reboot(machine_root, monkeypatch, name):
    root = machine_root(name)
    opened = []
    real_open = os.open

    def recording_open(path, *args, **kwargs):
        opened.append(os.path.relpath(path, root))
        return real_open(path, *args, **kwargs)

    # The reader opens files with os.open (vllm_cpu_topology.read_text).
    monkeypatch.setattr(os, "open", recording_open)
    read_cpu_facts(str(root))
    monkeypatch.undo()
    assert "proc/cpuinfo" in opened
    keyed = {rel for rel, _unused in KEY_FILES}
    unkeyed = [rel for rel in opened if rel not in keyed and not HARDWARE_ONLY.fullmatch(rel)]
    # Node meminfo is keyed by facts_key itself (one line per node).
    assert [rel for rel in unkeyed if not NODE_MEMINFO.fullmatch(rel)] == []


def test_the_key_is_stable_and_ignores_what_changes_every_second(machine_root):
    root = machine_root("spr-2s-amx")
    key = facts_key(str(root))
    assert key == facts_key(str(root))
    meminfo = (root / "proc/meminfo").read_text()
    (root / "proc/meminfo").write_text(re.sub(r"MemFree:\s+\d+", "MemFree: 12345", meminfo))
    assert facts_key(str(root)) == key


@pytest.mark.parametrize(
    ("name", "rel", "text"),
    [
        # a reboot (new hardware, another SNC/NPS setting, another kernel)
        ("spr-2s-amx", "proc/sys/kernel/random/boot_id", "0b6f9b1e-5d3a-4c1e-9a53-0c1d2e3f4a5b\n"),
        # the process affinity (taskset, systemd CPUAffinity)
        ("spr-2s-amx", "proc/self/status", "Name:\tpython3\nCpus_allowed_list:\t0-55\n"),
        # the memory nodes it may allocate on (numactl --membind, a container's --cpuset-mems)
        ("spr-2s-amx", "proc/self/status", "Name:\tpython3\nCpus_allowed_list:\t0-223\nMems_allowed_list:\t0\n"),
        ("milan-container-cpuset", "sys/fs/cgroup/cpuset.mems.effective", "0\n"),
        # CPU hotplug
        ("spr-2s-amx", "sys/devices/system/cpu/online", "0-111\n"),
        # the cgroup cpuset, memory and CPU limits (systemctl set-property, a container's --cpuset-cpus)
        ("milan-container-cpuset", "sys/fs/cgroup/cpuset.cpus.effective", "8-11,136-139\n"),
        ("milan-container-cpuset", "sys/fs/cgroup/memory.max", "17179869184\n"),
        ("milan-container-cpuset", "sys/fs/cgroup/cpu.max", "400000 100000\n"),
        # memory hotplug
        ("spr-2s-amx", "proc/meminfo", "MemTotal:       1000000000 kB\n"),
        ("spr-2s-amx", "sys/devices/system/node/node1/meminfo", "Node 1 MemTotal:       1000 kB\n"),
    ],
)
def test_the_key_changes_with_each_input_that_changes_without_a_reboot(machine_root, name, rel, text):
    root = machine_root(name)
    before = facts_key(str(root))
    write(root, rel, text)
    assert facts_key(str(root)) != before


def test_the_key_changes_with_the_module_options(machine_root):
    root = str(machine_root("spr-2s-amx"))
    keys = {facts_key(root), facts_key(root, numa="single"), facts_key(root, arch="x86_64")}
    assert len(keys) == 3
    assert facts_key(root) != facts_key(str(machine_root("icx-2s-snc2")))


def test_an_unreadable_key_file_is_part_of_the_key_not_an_error(machine_root):
    root = machine_root("spr-2s-amx")
    before = facts_key(str(root))
    (root / "sys/devices/system/cpu/possible").unlink()
    (root / "sys/devices/system/cpu/possible").mkdir()  # read() fails: IsADirectoryError
    assert facts_key(str(root)) != before
    assert facts_key(str(root / "nowhere")) != before
