"""vllm_cpu_facts through the ansible CLI on corrupted trees: a short failure naming the
file, never "MODULE FAILURE", a traceback or a MemoryError; the numa option reads a broken
node tree as one node on request."""

import expand
import pytest
from test_facts_module import run_module


@pytest.mark.parametrize("name", ["corrupt-cpulist-huger", "corrupt-numa-missing-2s", "corrupt-memory-max-zero"])
def test_corrupt_tree_fails_naming_the_file(tmp_path, name):
    spec = expand.load_corrupt(name)
    root = expand.expand(name, tmp_path / name)
    rc, status, result = run_module("-a", f"root={root}")
    assert (rc, status) == (2, "FAILED!"), result
    path = str(root / spec["error"]["file"])
    assert result["path"] == path
    assert result["msg"].startswith(f"cannot read CPU facts: {path}: ")
    assert spec["error"]["words"] in result["msg"] and "; fix: " in result["msg"]
    assert len(result["msg"]) < 600
    assert "module_stderr" not in result and "Traceback" not in str(result)


def test_numa_single_reads_a_broken_node_tree_as_one_node(tmp_path):
    root = expand.expand("corrupt-numa-missing-2s", tmp_path / "tree")
    rc, status, result = run_module("-a", f"root={root} numa=single")
    assert (rc, status) == (0, "SUCCESS"), result
    facts = result["ansible_facts"]["vllm_cpu"]
    assert [node["id"] for node in facts["numa_nodes"]] == [0] and facts["sockets"] == 2


def test_cpu_quota_is_reported(machine_root):
    root = machine_root("milan-container-cpuset")
    (root / "sys/fs/cgroup/cpu.max").write_text("150000 100000\n")
    rc, status, result = run_module("-a", f"root={root}")
    assert (rc, status) == (0, "SUCCESS"), result
    facts = result["ansible_facts"]["vllm_cpu"]
    assert (facts["cgroup"]["cpu_limit"], facts["usable_cpus"]) == (2, 2)
