"""Exact plans for the recorded machines, checked by hand (see docs/vllm-releases.md).

tests/fixtures/machines/<name>/expected_plan.json holds {"0.32.0": plan, "0.13.0": plan}
for the default options. Regenerate only after re-checking every changed line:
    python tests/unit/test_fixture_plans.py --write
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# conftest makes the collection importable, also when this file runs as a script.
from ansible_collections.vllm.cpu_fleet.tests.conftest import MACHINE_NAMES, MACHINES, load_expected_facts

VERSIONS = ("0.32.0", "0.13.0")


def plan(facts, options):
    from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import plan as make_plan

    return make_plan(facts, options)


def _plans(name):
    facts = load_expected_facts(name)
    return {v: plan(facts, {"vllm_version": v, "host": name}) for v in VERSIONS}


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_recorded_machine_plan(name):
    with open(MACHINES / name / "expected_plan.json", encoding="utf-8") as handle:
        assert _plans(name) == json.load(handle)


def test_sapphire_rapids_large_model_uses_tp_across_both_sockets():
    result = plan(load_expected_facts("spr-2s-amx"), {"vllm_version": "0.32.0", "model_size_gib": 700})
    (instance,) = result["instances"]
    assert instance["tp"] == 2 and instance["omp_threads_bind"] == "1-55|56-111"
    assert instance["reserved_cpus"] == "0,112"
    # node 0: 515519 MiB * 0.8 = 402.7 GiB - 350 GiB shard - 2 GiB runtime = 50.7
    assert instance["kvcache_gib"] == 50


def test_genoa_nps4_mid_model_pairs_nodes():
    # 200 GiB fits no 189 GiB node, so ranks pair up: 4 instances of TP 2.
    result = plan(load_expected_facts("genoa-2s-nps4"), {"vllm_version": "0.32.0", "model_size_gib": 200})
    assert [i["numa_nodes"] for i in result["instances"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [i["port"] for i in result["instances"]] == [8000, 8001, 8002, 8003]


def test_six_node_granite_rapids_never_uses_tp_6():
    result = plan(load_expected_facts("gnr-2s-snc3"), {"vllm_version": "0.32.0", "model_size_gib": 300})
    assert [i["tp"] for i in result["instances"]] == [2, 2, 2]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    for machine in MACHINE_NAMES:
        with open(MACHINES / machine / "expected_plan.json", "w", encoding="utf-8") as out:
            json.dump(_plans(machine), out, indent=1, sort_keys=True)
            out.write("\n")
