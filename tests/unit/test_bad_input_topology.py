"""Fact reader probes beyond the corrupted fixture trees: cgroup CPU quotas, the numa
option, and the parsers' refusal of non-ASCII numbers and unbounded CPU lists."""

import time

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import MAX_CPU_ID, parse_cpulist
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_topology import (
    TopologyError,
    parse_cpu_max,
    parse_distance,
    parse_meminfo_kib,
    parse_memory_limit,
    read_cpu_facts,
)

# ---------------------------------------------------------------- cgroup CPU quota


@pytest.mark.parametrize(
    ("cpu_max", "limit"),
    [("max 100000\n", None), ("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1), ("max\n", None)],
)
def test_parse_cpu_max_rounds_up(cpu_max, limit):
    assert parse_cpu_max(cpu_max) == limit


@pytest.mark.parametrize("text", ["lots 100000", "200000 0", "0 100000", "-1 100000", "200000", "2\u0660 100000", ""])
def test_parse_cpu_max_refuses_garbage(text):
    with pytest.raises(ValueError):
        parse_cpu_max(text)


def test_cgroup_v2_cpu_max_limits_usable_cpus(machine_root):
    root = machine_root("milan-container-cpuset")
    (root / "sys/fs/cgroup/cpu.max").write_text("200000 100000\n")
    facts = read_cpu_facts(str(root))
    assert facts["cgroup"]["cpu_limit"] == 2
    assert facts["usable_cpus"] == 2
    assert len(facts["allowed_cpus"]) == 12, "the quota limits time, not which CPUs"


def test_cgroup_v1_cfs_quota_limits_usable_cpus(machine_root):
    root = machine_root("spr-2s-amx")
    cpu = root / "sys/fs/cgroup/cpu,cpuacct"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("250000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    facts = read_cpu_facts(str(root))
    assert (facts["cgroup"]["version"], facts["cgroup"]["cpu_limit"], facts["usable_cpus"]) == (1, 3, 3)


def test_cgroup_v1_unlimited_quota(machine_root):
    root = machine_root("spr-2s-amx")
    cpu = root / "sys/fs/cgroup/cpu"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    facts = read_cpu_facts(str(root))
    assert facts["cgroup"]["cpu_limit"] is None and facts["usable_cpus"] == 224


def test_quota_above_allowed_cpus_leaves_them_all(machine_root):
    root = machine_root("milan-container-cpuset")
    (root / "sys/fs/cgroup/cpu.max").write_text("6400000 100000\n")
    facts = read_cpu_facts(str(root))
    assert (facts["cgroup"]["cpu_limit"], facts["usable_cpus"]) == (64, 12)


# ---------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    "text",
    [
        "MemTotal: \u0661\u0662 kB\n",  # Arabic-Indic
        "MemTotal: \uff11\uff12 kB\n",  # fullwidth
        "MemTotal: \u00b2 kB\n",  # superscript two: isdigit() but not int()
        "MemTotal: -5 kB\n",
        "MemTotal: 1e3 kB\n",
    ],
)
def test_meminfo_refuses_non_ascii_and_signed_numbers(text):
    with pytest.raises(ValueError):
        parse_meminfo_kib(text)


@pytest.mark.parametrize("text", ["0\n", "\u0661\u0660\u0660\u0660\u0660\u0660\u0660\n", "1048575\n"])
def test_memory_limit_refuses_zero_and_non_ascii(text):
    with pytest.raises(ValueError):
        parse_memory_limit(text)


def test_distance_refuses_non_ascii():
    with pytest.raises(ValueError):
        parse_distance("10 \u0662\u0661\n")


def test_meminfo_zero_total_is_refused(machine_root):
    root = machine_root("vm-2vcpu-nonuma")
    (root / "proc/meminfo").write_text("MemTotal: 0 kB\n")
    with pytest.raises(TopologyError, match="MemTotal is 0") as info:
        read_cpu_facts(str(root))
    assert info.value.path.endswith("proc/meminfo")


def test_implausible_memtotal_is_refused(machine_root):
    root = machine_root("vm-2vcpu-nonuma")
    (root / "proc/meminfo").write_text("MemTotal: 99999999999999999999999 kB\n")
    with pytest.raises(TopologyError, match="proc/meminfo"):
        read_cpu_facts(str(root))


# ---------------------------------------------------------------- cpulists


@pytest.mark.parametrize("text", ["0-9999999", "0-99999999", "99999999999999999999", f"{MAX_CPU_ID + 1}"])
def test_cpulist_ids_are_capped_quickly(text):
    started = time.monotonic()
    with pytest.raises(ValueError, match=str(MAX_CPU_ID)) as info:
        parse_cpulist(text)
    assert time.monotonic() - started < 0.5
    assert len(str(info.value)) < 200


def test_cpulist_error_echo_is_truncated():
    text = ",".join(str(i) for i in range(20000)) + ",x"
    with pytest.raises(ValueError) as info:
        parse_cpulist(text)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("text", ["\u0660-3", "0-\u0663", "\uff10", "1\u0660"])
def test_cpulist_refuses_unicode_digits(text):
    with pytest.raises(ValueError, match="invalid cpulist"):
        parse_cpulist(text)


def test_cpulist_highest_id_is_accepted():
    assert parse_cpulist(f"{MAX_CPU_ID}") == [MAX_CPU_ID]


# ---------------------------------------------------------------- the numa option


def test_numa_option_is_checked(machine_root):
    with pytest.raises(ValueError, match="numa must be one of"):
        read_cpu_facts(str(machine_root("vm-2vcpu-nonuma")), numa="maybe")


def test_numa_single_on_a_consistent_tree_merges_the_nodes(machine_root):
    facts = read_cpu_facts(str(machine_root("icx-2s-snc2")), numa="single")
    (node,) = facts["numa_nodes"]
    assert len(node["cores"]) == 80 and node["memory_mib"] == facts["memory_mib"]


def test_missing_node_dir_on_one_socket_is_still_one_node(machine_root):
    facts = read_cpu_facts(str(machine_root("vm-2vcpu-nonuma")))
    assert [n["id"] for n in facts["numa_nodes"]] == [0]


# ---------------------------------------------------------------- cpuinfo ISA lines


def test_aarch64_processor_without_features_is_refused(machine_root):
    root = machine_root("graviton3-c7g")
    text = (root / "proc/cpuinfo").read_text()
    blocks = text.split("\n\n")
    blocks[1] = "\n".join(line for line in blocks[1].splitlines() if not line.startswith("Features"))
    (root / "proc/cpuinfo").write_text("\n\n".join(blocks))
    with pytest.raises(TopologyError, match="processor 1 has no Features line; fix: "):
        read_cpu_facts(str(root))
