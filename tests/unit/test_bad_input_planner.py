"""Bad planner input (issue 13): every knob is coerced strictly and bounded, facts are
checked before they are trusted, and every refusal is one line
``<host>: <variable>: <problem>; fix: <fix>``; never a raw exception, never a wrong plan."""

import math
import re
import time

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import parse_cpulist
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import PlanError, check, plan
from ansible_collections.vllm.cpu_fleet.tests.unit.topologies import make_facts

V32 = {"vllm_version": "0.32.0", "host": "h1"}
MESSAGE = re.compile(r"^h1: [A-Za-z0-9_.\[\]]+: .+; fix: .+$", re.DOTALL)


def problems_for(options, facts=None):
    problems = check(make_facts([4, 4]) if facts is None else facts, dict(V32, **options))
    for problem in problems:
        assert MESSAGE.match(problem), problem
        assert len(problem) < 600, problem
    return problems


def assert_refused(options, variable, words, facts=None):
    problems = problems_for(options, facts)
    assert any(p.startswith(f"h1: {variable}: ") and words in p for p in problems), problems
    with pytest.raises(PlanError):
        plan(make_facts([4, 4]) if facts is None else facts, dict(V32, **options))


# ---------------------------------------------------------------- strings from -e


@pytest.mark.parametrize(
    ("knob", "text", "value"),
    [
        ("tp", "2", 2),
        ("tp", " 2 ", 2),
        ("max_jobs", "4", 4),
        ("kvcache_gib", "2", 2),
        ("kvcache_gib", "2.0", 2),
        ("model_size_gib", "30", 30.0),
        ("model_size_gib", "2.5", 2.5),
        ("memory_fraction", "0.5", 0.5),
        ("gpu_memory_utilization", "0.5", 0.5),
        ("reserved_cpus", "0", 0),
        ("base_port", "9000", 9000),
        ("runtime_overhead_gib", "1.5", 1.5),
        ("build_gib_per_job", "2", 2.0),
        ("build_reserved_gib", "0", 0.0),
        ("min_kvcache_gib", "2", 2),
    ],
)
def test_numbers_given_as_strings_plan_like_numbers(knob, text, value):
    facts = make_facts([4, 4])
    assert plan(facts, dict(V32, **{knob: text})) == plan(facts, dict(V32, **{knob: value}))


def test_tp_string_plans_tensor_parallel():
    (instance,) = plan(make_facts([4, 4]), dict(V32, tp="2"))["instances"]
    assert instance["tp"] == 2


def test_max_jobs_string_sets_max_jobs():
    assert plan(make_facts([4, 4]), dict(V32, max_jobs="4"))["build"]["env"]["MAX_JOBS"] == "4"


# ---------------------------------------------------------------- wrong types and values


@pytest.mark.parametrize(
    ("options", "variable", "words"),
    [
        # integers
        ({"tp": "abc"}, "tp", "'abc' is not a whole number"),
        ({"tp": ""}, "tp", "is empty"),
        ({"tp": True}, "tp", "True is a boolean"),
        ({"tp": "2.5"}, "tp", "not a whole number"),
        ({"tp": 2.5}, "tp", "not a whole number"),
        ({"tp": [2]}, "tp", "is a list"),
        ({"tp": {"n": 2}}, "tp", "is a dict"),
        ({"tp": 0}, "tp", "at least 1"),
        ({"tp": -2}, "tp", "at least 1"),
        ({"tp": 10**30}, "tp", "at most"),
        ({"tp": float("nan")}, "tp", "not a whole number"),
        ({"max_jobs": "4x"}, "max_jobs", "not a whole number"),
        ({"max_jobs": 0}, "max_jobs", "at least 1"),
        ({"max_jobs": False}, "max_jobs", "boolean"),
        ({"reserved_cpus": -1}, "reserved_cpus", "at least 0"),
        ({"reserved_cpus": "one"}, "reserved_cpus", "not a whole number"),
        ({"min_kvcache_gib": 0}, "min_kvcache_gib", "at least 1"),
        # KV cache: VLLM_CPU_KVCACHE_SPACE is whole GiB
        ({"kvcache_gib": -5}, "kvcache_gib", "at least 1"),
        ({"kvcache_gib": 0}, "kvcache_gib", "at least 1"),
        ({"kvcache_gib": "2.5"}, "kvcache_gib", "not a whole number"),
        ({"kvcache_gib": 2.5}, "kvcache_gib", "not a whole number"),
        ({"kvcache_gib": "abc"}, "kvcache_gib", "not a whole number"),
        # sizes
        ({"model_size_gib": -1000}, "model_size_gib", "above 0"),
        ({"model_size_gib": 0}, "model_size_gib", "above 0"),
        ({"model_size_gib": "abc"}, "model_size_gib", "'abc' is not a number"),
        ({"model_size_gib": float("inf")}, "model_size_gib", "not a finite number"),
        ({"model_size_gib": float("nan")}, "model_size_gib", "not a finite number"),
        ({"model_size_gib": "nan"}, "model_size_gib", "not a number"),
        ({"model_size_gib": "1e999"}, "model_size_gib", "not a finite number"),
        ({"model_size_gib": 1e12}, "model_size_gib", "at most"),
        ({"model_size_gib": [1]}, "model_size_gib", "is a list"),
        ({"runtime_overhead_gib": -1}, "runtime_overhead_gib", "at least 0"),
        ({"build_gib_per_job": 0}, "build_gib_per_job", "above 0"),
        ({"build_gib_per_job": -3}, "build_gib_per_job", "above 0"),
        ({"build_reserved_gib": -1}, "build_reserved_gib", "at least 0"),
        ({"memory_fraction": 1.5}, "memory_fraction", "share of a NUMA node's RAM"),
        ({"memory_fraction": -0.5}, "memory_fraction", "share of a NUMA node's RAM"),
        ({"memory_fraction": "abc"}, "memory_fraction", "not a number"),
        ({"memory_fraction": float("nan")}, "memory_fraction", "not a finite number"),
        ({"memory_fraction": True}, "memory_fraction", "boolean"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization", "share of a NUMA node's RAM"),
        # ports
        ({"base_port": 70000}, "base_port", "at most 65535"),
        ({"base_port": 0}, "base_port", "at least 1"),
        ({"base_port": -80}, "base_port", "at least 1"),
        ({"base_port": 65535}, "base_port", "instance 1 would listen on 65536"),
        ({"base_port": "http"}, "base_port", "not a whole number"),
        # choices
        ({"dtype": "garbage"}, "dtype", "'garbage' is not a dtype"),
        ({"dtype": 16}, "dtype", "is an integer"),
        ({"mode": 5}, "mode", "is an integer"),
        ({"mode": ["dp"]}, "mode", "is a list"),
        ({"numa": "maybe"}, "numa", "strict, single"),
        ({"vllm_version": None}, "vllm_version", "is not set; fix: set it in the inventory"),
        ({"vllm_version": 0.32}, "vllm_version", "not supported"),
        ({"vllm_version": "x" * 100000}, "vllm_version", "not supported"),
        # binds
        ({"omp_threads_bind": []}, "omp_threads_bind", "empty list"),
        ({"omp_threads_bind": [5]}, "omp_threads_bind[0]", "is an integer"),
        ({"omp_threads_bind": [["0-3"]]}, "omp_threads_bind[0]", "is a list"),
        ({"omp_threads_bind": {"a": "0-3"}}, "omp_threads_bind", "is a dict"),
        ({"omp_threads_bind": ""}, "omp_threads_bind[0]", "binds no CPU"),
        ({"omp_threads_bind": ["0-99999"]}, "omp_threads_bind[0]", "CPU id above 65535"),
        ({"omp_threads_bind": ["0-99999999"]}, "omp_threads_bind[0]", "CPU id above 65535"),
        ({"omp_threads_bind": ["0-3|"]}, "omp_threads_bind[0]", "rank 1 binds no CPU"),
        # a typo is not silently ignored
        ({"kv_cache_gib": 4}, "kv_cache_gib", "not a planner option"),
    ],
)
def test_bad_values_are_refused_naming_variable_and_fix(options, variable, words):
    assert_refused(options, variable, words)


def test_huge_bind_is_refused_fast_with_a_short_message():
    started = time.monotonic()
    problems = problems_for({"omp_threads_bind": ["0-99999999|" * 1000 + "0"]})
    assert time.monotonic() - started < 1
    assert problems and sum(len(p) for p in problems) < 5000, problems


def test_options_and_facts_of_the_wrong_kind_are_refused():
    assert check(make_facts([4]), ["tp", 2])[0].startswith("host: options: is a list")
    assert check("facts", V32)[0].startswith("h1: vllm_cpu: is a string")
    with pytest.raises(PlanError):
        plan(None, V32)


def test_prefix_names_the_role_variable():
    problems = check(make_facts([4, 4]), dict(V32, tp="abc", variable_prefix="vllm_plan_"))
    assert problems == [
        "h1: vllm_plan_tp: 'abc' is not a whole number; "
        "fix: set it to a whole number such as 2, or leave it unset (null)"
    ]


def test_valid_dtypes_pass_through():
    for dtype in ("bfloat16", "float16", "half", "float32", "float", "auto"):
        assert plan(make_facts([4]), dict(V32, dtype=dtype))["instances"][0]["dtype"] == dtype


# ---------------------------------------------------------------- facts


@pytest.mark.parametrize(
    ("change", "variable", "words"),
    [
        ({"memory_mib": 0}, "vllm_cpu.memory_mib", "not above 0"),
        ({"memory_mib": -1}, "vllm_cpu.memory_mib", "not above 0"),
        ({"memory_mib": "lots"}, "vllm_cpu.memory_mib", "not a whole number"),
        ({"arch": None}, "vllm_cpu.arch", "missing"),
        ({"numa_nodes": "0-3"}, "vllm_cpu.numa_nodes", "is a string"),
        ({"allowed_cpus": [0, "x"]}, "vllm_cpu.allowed_cpus", "'x'"),
        ({"cgroup": {"version": 2, "cpus": None, "memory_max_mib": None, "cpu_limit": 0}}, "vllm_cpu.cgroup.cpu_limit",
         "at least 1"),
    ],
)
def test_bad_facts_are_refused(change, variable, words):
    facts = make_facts([4, 4])
    facts.update(change)
    assert_refused({}, variable, words, facts=facts)


def test_overlapping_nodes_in_facts_are_refused():
    facts = make_facts([4, 4])
    facts["numa_nodes"][1]["cores"].append([0, 8])
    assert_refused({}, "vllm_cpu.numa_nodes", "CPU 0 is in NUMA nodes 0 and 1", facts=facts)


def test_cpus_in_no_node_are_refused():
    facts = make_facts([4, 4])
    del facts["numa_nodes"][1]
    assert_refused({}, "vllm_cpu.numa_nodes", "4-7,12-15", facts=facts)


def test_numa_single_plans_an_inconsistent_view_as_one_node():
    facts = make_facts([4, 4])
    facts["numa_nodes"][1]["cores"].append([0, 8])
    (instance,) = plan(facts, dict(V32, numa="single"))["instances"]
    assert instance["numa_nodes"] == [0] and instance["omp_threads_bind"] == "1-7"


# ---------------------------------------------------------------- cgroup CPU quota


def quota_facts(limit, nodes=(38, 38)):
    facts = make_facts(list(nodes), smt=2, node_memory_mib=256 * 1024)
    facts["cgroup"]["cpu_limit"] = limit
    facts["usable_cpus"] = min(limit, len(facts["allowed_cpus"]))
    return facts


def threads_per_rank(instance):
    return [len(parse_cpulist(rank)) for rank in instance["omp_threads_bind"].split("|")]


def threads(result):
    return sum(sum(threads_per_rank(i)) for i in result["instances"])


def test_two_cpu_quota_gives_two_cpus_of_work():
    result = plan(quota_facts(2), V32)
    assert threads(result) == 1 and len(result["instances"]) == 1, "one thread plus the reserved core"
    assert result["instances"][0]["numa_nodes"] == [0], "node 1 is left out"
    assert result["build"]["max_jobs"] <= 2
    (instance,) = result["instances"]
    assert threads_per_rank(instance) == [1]


def test_quota_is_shared_by_the_instances():
    result = plan(quota_facts(8), V32)
    assert [threads_per_rank(i) for i in result["instances"]] == [[3], [3]]
    assert threads(result) + len(result["instances"]) <= 8
    assert result["build"]["env"]["MAX_JOBS"] == "8"


def test_quota_with_tensor_parallel():
    result = plan(quota_facts(6), dict(V32, tp=2))
    (instance,) = result["instances"]
    assert threads_per_rank(instance) == [2, 2] and threads(result) + 1 <= 6


def test_quota_too_small_for_one_instance_is_refused():
    assert_refused({}, "reserved_cpus", "quota", facts=quota_facts(1))
    assert threads_per_rank(plan(quota_facts(1), dict(V32, reserved_cpus=0))["instances"][0]) == [1]


def test_bind_beyond_the_quota_is_refused():
    assert_refused({"omp_threads_bind": ["0-9"]}, "omp_threads_bind", "quota", facts=quota_facts(4))


def test_large_quota_changes_nothing():
    facts = quota_facts(1000)
    no_quota = make_facts([38, 38], smt=2, node_memory_mib=256 * 1024)
    assert plan(facts, V32) == plan(no_quota, V32)


def test_usable_cpus_fact_caps_max_jobs_without_cgroup_key():
    facts = make_facts([38, 38], smt=2, node_memory_mib=256 * 1024)
    facts["usable_cpus"] = 3
    assert plan(facts, V32)["build"]["max_jobs"] <= 3


def test_no_nan_reaches_the_plan():
    result = plan(make_facts([4, 4]), dict(V32, model_size_gib="1.5", runtime_overhead_gib="0"))
    for instance in result["instances"]:
        assert isinstance(instance["kvcache_gib"], int) and not math.isnan(instance["kvcache_gib"])


def test_duplicate_node_ids_and_odd_hosts_are_refused_without_crashing():
    facts = make_facts([4, 4])
    facts["numa_nodes"][1]["id"] = 0
    assert_refused({}, "vllm_cpu.numa_nodes", "node id twice", facts=facts)
    problems = check(make_facts([4]), {"vllm_version": "0.32.0", "host": ["a"] * 1000, "tp": "x"})
    assert problems and all(len(p) < 300 for p in problems)
