"""Invariants of every plan over random topologies (Hypothesis)."""

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_cpulist import parse_cpulist
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import DEFAULTS, PlanError, check, plan
from ansible_collections.vllm.cpu_fleet.tests.unit.topologies import make_facts
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st


@st.composite
def machines(draw):
    nodes_cores = draw(st.lists(st.integers(1, 12), min_size=1, max_size=8))
    smt = draw(st.sampled_from([1, 2]))
    total_cpus = sum(nodes_cores) * smt
    cpu_ids = st.integers(0, total_cpus - 1)
    facts = make_facts(
        nodes_cores,
        smt=smt,
        adjacent_siblings=draw(st.booleans()),
        node_memory_mib=draw(st.integers(4, 512)) * 1024,
        memory_only_nodes=draw(st.integers(0, 1)),
        memory_denied=draw(st.sets(st.integers(0, len(nodes_cores) - 1), max_size=1)),
        offline=draw(st.sets(cpu_ids, max_size=3)),
        disallowed=draw(st.sets(cpu_ids, max_size=3)),
    )
    assume(any(node["cores"] for node in facts["numa_nodes"]))
    return facts


@st.composite
def options(draw):
    return {
        "vllm_version": draw(st.sampled_from(["0.13.0", "0.32.0", "0.33.0"])),
        "host": "prop",
        "mode": draw(st.sampled_from(["auto", "dp", "tp"])),
        "model_size_gib": draw(st.sampled_from([0.5, 1, 8, 30, 140])),
        "reserved_cpus": draw(st.sampled_from([None, 0, 1, 2])),
    }


def _core_of(facts):
    return {cpu: tuple(core) for node in facts["numa_nodes"] for core in node["cores"] for cpu in core}


def _node_of(facts):
    return {cpu: node["id"] for node in facts["numa_nodes"] for cpu in node["cpus"]}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(machines(), options())
def test_plans_keep_every_invariant(facts, opts):
    problems = check(facts, opts)
    if problems:
        assert all(p.startswith("prop: ") and "; fix: " in p for p in problems)
        return
    result = plan(facts, opts)
    core_of, node_of = _core_of(facts), _node_of(facts)
    usable = set(facts["online_cpus"]) & set(facts["allowed_cpus"])
    memory = {node["id"]: node["memory_mib"] for node in facts["numa_nodes"]}
    denied = {node["id"] for node in facts["numa_nodes"] if not node["memory_allowed"]}
    assert result["numa_nodes_without_memory"] == sorted(n["id"] for n in facts["numa_nodes"]
                                                         if n["cores"] and n["id"] in denied)  # fmt: skip
    bound_cores, reserved_cores = [], set()
    for instance in result["instances"]:
        reserved = set(parse_cpulist(instance["reserved_cpus"]))
        ranks = [parse_cpulist(rank) for rank in instance["omp_threads_bind"].split("|")]
        assert len(ranks) == instance["tp"] == len(instance["numa_nodes"])
        for rank, node in zip(ranks, instance["numa_nodes"], strict=True):
            assert rank, "every rank binds at least one CPU"
            assert set(rank) <= usable, "bound CPUs exist, are online and allowed"
            assert {node_of[cpu] for cpu in rank} == {node}, "each rank stays inside its node"
            assert node not in denied, "no rank where the process may not allocate memory"
            assert not set(rank) & reserved, "reserved CPUs are never bound"
            bound_cores += [core_of[cpu] for cpu in rank]
            shard = float(opts["model_size_gib"]) / instance["tp"]
            room = memory[node] / 1024 * DEFAULTS["memory_fraction"] - shard - DEFAULTS["runtime_overhead_gib"]
            assert instance["kvcache_gib"] <= room, "weights shard + runtime + KV fit the node"
        reserved_cores |= {core_of[cpu] for cpu in reserved}
        assert instance["kvcache_gib"] > 0
    assert len(bound_cores) == len(set(bound_cores)), "one bound CPU per physical core, no core shared"
    used_nodes = {n for i in result["instances"] for n in i["numa_nodes"]}
    idle = {core for cpu, core in core_of.items() if node_of[cpu] in used_nodes} - set(bound_cores) - reserved_cores
    assert not idle, "no idle physical core beyond the reserved ones"
    build = result["build"]
    assert build["max_jobs"] >= 1
    assert build["max_jobs"] <= max(1, len(facts["allowed_cpus"]))
    memory_for_build = facts["memory_mib"] / 1024 - DEFAULTS["build_reserved_gib"]
    fits = build["max_jobs"] * DEFAULTS["build_gib_per_job"] <= memory_for_build
    assert build["fits_memory"] == fits
    assert fits or build["max_jobs"] == 1


@settings(max_examples=100, deadline=None)
@given(machines())
def test_small_models_always_plan_one_instance_per_cpu_node(facts):
    opts = {"vllm_version": "0.32.0", "model_size_gib": 0.5, "reserved_cpus": 0}
    assume(all(node["memory_mib"] >= 8 * 1024 for node in facts["numa_nodes"]))
    cpu_nodes = [node["id"] for node in facts["numa_nodes"] if node["cores"] and node["memory_allowed"]]
    assume(cpu_nodes)
    result = plan(facts, opts)
    assert [i["numa_nodes"] for i in result["instances"]] == [[n] for n in cpu_nodes]
    assert [i["port"] for i in result["instances"]] == list(range(8000, 8000 + len(cpu_nodes)))


GARBAGE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["2", " 4 ", "2.0", "2.5", "-1", "0", "1e999", "nan", "inf", "0-3", "0-99999999", "1|2", ""]),
    st.lists(st.one_of(st.integers(-5, 40), st.text(max_size=6)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
KNOBS = [*sorted(set(DEFAULTS) - {"host", "variable_prefix"}), "no_such_knob"]


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(st.sampled_from(KNOBS), GARBAGE, min_size=1, max_size=4), st.sampled_from([None, 2, 5, 64]))
# Found by Hypothesis: memory / 5e-324 GiB per job is infinity, which no job count is.
@example(knobs={"build_gib_per_job": 5e-324}, cpu_limit=None)
def test_any_knob_value_plans_or_is_refused_in_the_projects_words(knobs, cpu_limit):
    """Whatever reaches the planner (strings from -e, lists, NaN, huge numbers), it returns a
    plan that holds together or raises PlanError whose every line names host, variable and fix."""
    facts = make_facts([4, 4], smt=2)
    facts["cgroup"]["cpu_limit"] = cpu_limit
    options = dict({"vllm_version": "0.32.0", "host": "prop"}, **knobs)
    try:
        result = plan(facts, options)
    except PlanError as err:
        assert err.problems
        for problem in err.problems:
            assert problem.startswith("prop: ") and "; fix: " in problem, problem
            assert len(problem) < 1000, problem
        assert check(facts, options) == err.problems
        return
    assert check(facts, options) == []
    assert result["instances"], "a plan always has an instance"
    threads = 0
    for instance in result["instances"]:
        assert isinstance(instance["kvcache_gib"], int) and instance["kvcache_gib"] >= 1
        assert 1 <= instance["port"] <= 65535
        assert instance["env"]["VLLM_CPU_KVCACHE_SPACE"] == str(instance["kvcache_gib"])
        ranks = [parse_cpulist(rank) for rank in instance["omp_threads_bind"].split("|")]
        assert all(ranks) and len(ranks) == instance["tp"]
        threads += sum(len(rank) for rank in ranks)
    max_jobs = result["build"]["max_jobs"]
    assert isinstance(max_jobs, int) and max_jobs >= 1
    assert result["build"]["env"]["MAX_JOBS"] == str(max_jobs)
    if cpu_limit is not None:
        assert threads <= cpu_limit, "OpenMP threads stay within the cgroup CPU quota"
        if "max_jobs" not in knobs:
            assert max_jobs <= cpu_limit
