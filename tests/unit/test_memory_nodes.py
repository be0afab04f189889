"""Memory a rank can use, on recorded machine trees: a NUMA node whose memory this process
cannot allocate (MemTotal 0, or outside Mems_allowed_list / the cgroup's cpuset.mems) gets no
rank, since vLLM binds each rank's memory to its CPUs' node; with numa single the KV cache is
sized from the memory the release's binding uses (the release table's memory_binding), never
from memory-only (CXL, HBM) nodes."""

import re

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_topology import read_cpu_facts
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import PlanError, check, plan

V32 = {"vllm_version": "0.32.0", "host": "h1"}
V13 = {"vllm_version": "0.13.0", "host": "h1"}
# Recorded node memory (MiB): spr-2s-amx 515519 and 516278; genoa-cxl-memnode node 0 386513, node 1 (CXL) 262144.
SPR_NODE0_KV = 399  # 515519 / 1024 * 0.8 - 1 GiB weights - 2 GiB runtime = 399.7
SPR_NODE1_KV = 400


def _set_status(root, field, value):
    status = root / "proc/self/status"
    status.write_text(re.sub(rf"{field}:.*", f"{field}:\t{value}", status.read_text()))


def _write(root, rel, text):
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def _node_meminfo(node, kib):
    return f"Node {node} MemTotal:       {kib} kB\nNode {node} MemFree:        {kib} kB\n"


# ---------------------------------------------------------------- allowed memory nodes


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("proc/self/status", None),  # Mems_allowed_list: the process's own view
        ("sys/fs/cgroup/cpuset.mems.effective", "1\n"),  # cgroup v2
        ("sys/fs/cgroup/cpuset/cpuset.effective_mems", "1\n"),  # cgroup v1
        ("sys/fs/cgroup/cpuset/cpuset.mems", "1\n"),  # cgroup v1 without the effective file
    ],
)
def test_a_node_the_process_may_not_allocate_on_gets_no_rank(machine_root, rel, text):
    root = machine_root("spr-2s-amx")
    if text is None:
        _set_status(root, "Mems_allowed_list", "1")
    else:
        _write(root, rel, text)
    facts = read_cpu_facts(str(root))
    assert [(n["id"], n["memory_allowed"]) for n in facts["numa_nodes"]] == [(0, False), (1, True)]
    assert len(facts["numa_nodes"][0]["cores"]) == 56, "node 0's CPUs stay in the facts"
    result = plan(facts, V32)
    assert [i["numa_nodes"] for i in result["instances"]] == [[1]]
    assert result["instances"][0]["kvcache_gib"] == SPR_NODE1_KV
    assert result["numa_nodes_without_memory"] == [0]


def test_a_container_limited_to_node_0_memory_serves_only_node_0(machine_root):
    # The auditor's container: CPUs on both sockets, memory on node 0 only (--cpuset-mems 0).
    root = machine_root("milan-container-cpuset")
    _write(root, "sys/fs/cgroup/cpuset.cpus.effective", "8-15,72-79,136-143,200-207\n")
    _write(root, "sys/fs/cgroup/memory.max", "max\n")
    _write(root, "sys/fs/cgroup/cpuset.mems.effective", "0\n")
    _set_status(root, "Cpus_allowed_list", "0-255")
    _set_status(root, "Mems_allowed_list", "0")
    facts = read_cpu_facts(str(root))
    assert facts["cgroup"]["mems"] == [0]
    assert [n["memory_allowed"] for n in facts["numa_nodes"]] == [True, False]
    result = plan(facts, V32)
    (instance,) = result["instances"]
    assert (instance["numa_nodes"], instance["omp_threads_bind"], instance["reserved_cpus"]) == ([0], "9-15", "8,136")
    assert instance["kvcache_gib"] == 198  # node 0's 257541 MiB * 0.8 - 3 GiB
    assert result["numa_nodes_without_memory"] == [1]


def test_no_allowed_cpu_on_a_node_with_memory_is_a_plan_error_naming_the_nodes(machine_root):
    root = machine_root("milan-container-cpuset")  # allowed CPUs are all on node 0
    _set_status(root, "Mems_allowed_list", "1")
    facts = read_cpu_facts(str(root))
    with pytest.raises(PlanError) as info:
        plan(facts, V32)
    (problem,) = info.value.problems
    assert problem.startswith("h1: vllm_cpu.numa_nodes: the allowed CPUs are on NUMA node(s) 0, which have no memory")
    assert "Mems_allowed_list" in problem and "; fix: allow the process memory on those nodes" in problem


# ---------------------------------------------------------------- nodes with CPUs and no memory


@pytest.fixture
def icx_node1_without_memory(machine_root):
    root = machine_root("icx-2s-snc2")
    _write(root, "sys/devices/system/node/node1/meminfo", _node_meminfo(1, 0))
    _write(root, "sys/devices/system/node/has_memory", "0,2-3\n")
    return read_cpu_facts(str(root))


def test_a_memoryless_cpu_node_is_left_idle_and_reported(icx_node1_without_memory):
    facts = icx_node1_without_memory
    assert [n["memory_mib"] for n in facts["numa_nodes"]][1] == 0
    result = plan(facts, V32)
    assert [i["numa_nodes"] for i in result["instances"]] == [[0], [2], [3]]
    assert result["numa_nodes_without_memory"] == [1]
    assert [i["port"] for i in result["instances"]] == [8000, 8001, 8002]
    (tp,) = plan(facts, dict(V32, mode="tp"))["instances"]
    assert (tp["numa_nodes"], tp["omp_threads_bind"]) == ([0, 2, 3], "1-19|40-59|60-79")


def test_a_bind_onto_a_memoryless_node_is_refused_for_that_reason(icx_node1_without_memory):
    problems = check(icx_node1_without_memory, dict(V32, omp_threads_bind=["21-39"]))
    assert problems == [
        "h1: omp_threads_bind[0]: rank 0 binds CPUs 21-39, on a NUMA node without memory this process may allocate "
        "(MemTotal 0, or outside Mems_allowed_list / the cgroup's cpuset.mems), where vLLM would bind the rank's "
        "memory; fix: drop them"
    ]


# ---------------------------------------------------------------- numa single


def test_numa_single_sizes_the_kv_cache_without_the_cxl_node(machine_root):
    root = machine_root("genoa-cxl-memnode")
    strict = read_cpu_facts(str(root))
    kv = plan(strict, V32)["instances"][0]["kvcache_gib"]
    assert kv == 298  # node 0: 386513 MiB * 0.8 - 3 GiB
    for version in (V32, V13):
        assert plan(strict, dict(version, numa="single"))["instances"][0]["kvcache_gib"] == kv
    single = read_cpu_facts(str(root), numa="single")
    (node,) = single["numa_nodes"]
    assert node["memory_mib"] == strict["numa_nodes"][0]["memory_mib"] == 386513
    assert plan(single, dict(V32, numa="single"))["instances"][0]["kvcache_gib"] == kv


def test_numa_single_follows_the_releases_memory_binding(machine_root):
    facts = read_cpu_facts(str(machine_root("spr-2s-amx")))
    # 0.20.0+ bind a rank's memory to its first CPU's node, 0.13.0-0.19.1 to every bound CPU's node.
    (v32,) = plan(facts, dict(V32, numa="single"))["instances"]
    assert (v32["omp_threads_bind"], v32["kvcache_gib"]) == ("1-111", SPR_NODE0_KV)
    (v13,) = plan(facts, dict(V13, numa="single"))["instances"]
    assert v13["kvcache_gib"] == 803  # (515519 + 516278) MiB * 0.8 - 3 GiB


def test_numa_single_sizes_the_kv_cache_from_the_ranks_as_bound_under_a_cpu_quota(machine_root):
    root = machine_root("spr-2s-amx")
    _write(root, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "800000\n")
    _write(root, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    (instance,) = plan(read_cpu_facts(str(root)), dict(V13, numa="single"))["instances"]
    # Eight CPUs of time: one reserved core and seven threads, all on node 0, so only node 0's memory.
    assert (instance["omp_threads_bind"], instance["kvcache_gib"]) == ("1-7", SPR_NODE0_KV)


def test_numa_single_facts_leave_out_memory_the_process_may_not_allocate(machine_root):
    root = machine_root("spr-2s-amx")
    whole = read_cpu_facts(str(root), numa="single")["numa_nodes"][0]["memory_mib"]
    _set_status(root, "Mems_allowed_list", "0")
    (node,) = read_cpu_facts(str(root), numa="single")["numa_nodes"]
    assert node["memory_mib"] == whole - 516278
