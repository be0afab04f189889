"""Corrupted /proc + /sys trees (tests/fixtures/machines/corrupt-*/corrupt.yaml): the fact
reader refuses each one with a TopologyError that names the file, says what is wrong and
how to fix it, quickly and with a short message; never a raw exception, never wrong facts.
"""

import time

import expand
import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_topology import TopologyError, read_cpu_facts

CORRUPT = expand.corrupt_names()


def test_corrupt_trees_are_recorded():
    assert len(CORRUPT) >= 15


@pytest.mark.parametrize("name", CORRUPT)
def test_corrupt_tree_is_refused_naming_the_file(tmp_path, name):
    spec = expand.load_corrupt(name)
    root = expand.expand(name, tmp_path / name)
    started = time.monotonic()
    with pytest.raises(TopologyError) as info:
        read_cpu_facts(str(root), **(spec.get("options") or {}))
    assert time.monotonic() - started < 5, "refused quickly"
    message = str(info.value)
    assert info.value.path == str(root / spec["error"]["file"])
    assert message.startswith(f"{root / spec['error']['file']}: "), message
    assert spec["error"]["words"] in message, message
    assert "; fix: " in message, message
    assert len(message) < 600, message


@pytest.mark.parametrize("name", [n for n in CORRUPT if expand.load_corrupt(n).get("numa_single")])
def test_numa_single_reads_the_tree_as_one_node(tmp_path, name):
    root = expand.expand(name, tmp_path / name)
    facts = read_cpu_facts(str(root), numa="single")
    (node,) = facts["numa_nodes"]
    assert node["id"] == 0
    assert node["cpus"] == facts["allowed_cpus"]
    assert sorted(c for core in node["cores"] for c in core) == facts["allowed_cpus"]
    assert node["memory_mib"] == facts["memory_mib"] and node["distance"] == [10]
