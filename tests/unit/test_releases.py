"""The release table holds what each vLLM sdist says (docs/vllm-releases.md cites the lines)."""

import pytest
from ansible.module_utils.vllm_cpu_releases import (
    RELEASES,
    UnknownReleaseError,
    build_class,
    build_isa_env,
    compiler_verdict,
    release_info,
)

SPR_ISA = {"avx2": True, "avx512f": True, "avx512_bf16": True, "avx512_vnni": True, "amx_bf16": True}
ICX_ISA = {"avx2": True, "avx512f": True, "avx512_vnni": True}
AVX2_ISA = {"avx2": True}
ARM_ISA = {"asimd": True, "bf16": True, "i8mm": True}
REQUIRED_KEYS = {
    "version", "min_gcc", "gcc_below_min", "isas_dropped_below_min", "universal_x86_wheel", "build_isa_env",
    "env_vars", "reserved_cpus_scope", "has_sgl_kernel", "preloads_tcmalloc", "preloads_iomp",
    "build_requirements", "runtime_requirements", "torch_version", "python_versions",
}  # fmt: skip


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_every_release_has_the_documented_keys(version):
    assert set(release_info(version)) >= REQUIRED_KEYS
    assert release_info(version)["version"] == version


def test_v0_13_facts():
    info = release_info("0.13.0")
    assert info["torch_version"] == "2.9.1"
    assert info["min_gcc"] == "12.3" and info["gcc_below_min"] == "degrade"
    assert info["isas_dropped_below_min"] == ["avx512_bf16", "avx512_vnni", "amx_bf16"]
    assert info["universal_x86_wheel"] is False
    assert info["reserved_cpus_scope"] == "per_rank"
    assert info["has_sgl_kernel"] and "VLLM_CPU_SGL_KERNEL" in info["env_vars"]
    assert not info["preloads_tcmalloc"] and not info["preloads_iomp"]
    assert info["build_requirements"] == "requirements/cpu-build.txt"
    assert info["python_versions"] == ["3.10", "3.11", "3.12", "3.13"]


@pytest.mark.parametrize(("version", "torch"), [("0.32.0", "2.13.0"), ("0.33.0", "2.14.0")])
def test_v0_32_and_v0_33_facts(version, torch):
    info = release_info(version)
    assert info["torch_version"] == torch
    assert info["gcc_below_min"] == "fatal" and info["isas_dropped_below_min"] == []
    assert info["universal_x86_wheel"] is True
    assert info["reserved_cpus_scope"] == "total"
    assert not info["has_sgl_kernel"] and "VLLM_CPU_SGL_KERNEL" not in info["env_vars"]
    assert info["preloads_tcmalloc"] and not info["preloads_iomp"]
    assert info["build_requirements"] == "requirements/build/cpu.txt"
    assert info["runtime_requirements"] == "requirements/cpu.txt"
    assert "3.14" in info["python_versions"] and "3.10" not in info["python_versions"]


def test_no_release_reads_moe_prepack():
    # Listed only in envs.py's compile-hash ignore list; no code reads it.
    assert all("VLLM_CPU_MOE_PREPACK" not in r["env_vars"] for r in RELEASES.values())


def test_v_prefix_and_copy():
    info = release_info("v0.32.0")
    info["env_vars"].append("X")
    assert "X" not in release_info("0.32.0")["env_vars"]


def test_unknown_version_lists_supported():
    with pytest.raises(UnknownReleaseError, match=r"0\.13\.0, 0\.31\.0, 0\.32\.0, 0\.33\.0") as err:
        release_info("0.30.0")
    assert isinstance(err.value, ValueError)


def test_build_classes():
    spr = {"arch": "x86_64", "isa_class": "x86_64-amx", "isa": SPR_ISA}
    graviton = {"arch": "aarch64", "isa_class": "aarch64-bf16", "isa": ARM_ISA}
    assert build_class("0.32.0", spr) == "x86_64"
    assert build_class("0.13.0", spr) == "x86_64-amx"
    assert build_class("0.32.0", graviton) == "aarch64-bf16-i8mm"
    assert build_class("0.13.0", graviton) == "aarch64-bf16"
    assert build_isa_env("0.13.0", "x86_64-avx2") == {"VLLM_CPU_DISABLE_AVX512": "true"}
    assert build_isa_env("0.13.0", "x86_64-amx") == {
        "VLLM_CPU_AVX512BF16": "1", "VLLM_CPU_AVX512VNNI": "1", "VLLM_CPU_AMXBF16": "1",
    }  # fmt: skip
    assert build_isa_env("0.32.0", "x86_64") == {}
    assert build_isa_env("0.33.0", "aarch64-bf16-i8mm") == {"VLLM_CPU_ARM_BF16": "1", "VLLM_CPU_ARM_I8MM": "1"}


@pytest.mark.parametrize("gcc", ["12.3.0", "12.4", "13.2.0", "14.2.0-19"])
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_new_enough_gcc_is_ok(gcc, version):
    verdict = compiler_verdict(version, gcc, SPR_ISA, "x86_64")
    assert verdict["ok"] and verdict["severity"] == "ok" and verdict["missing_isas"] == []


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_old_gcc_is_fatal_on_x86_for_new_releases(version):
    verdict = compiler_verdict(version, "12.2.0", AVX2_ISA, "x86_64", accept_degraded=True, host="web1")
    assert verdict == {
        "ok": False,
        "severity": "fatal",
        "min_gcc": "12.3",
        "missing_isas": [],
        "message": verdict["message"],
    }
    for words in ("web1", version, "12.2.0", "12.3", "gcc-13", "builder"):
        assert words in verdict["message"]


def test_old_gcc_degrades_v0_13_and_names_the_opt_in():
    verdict = compiler_verdict("0.13.0", "12.2.0", SPR_ISA, "x86_64", host="spr1")
    assert not verdict["ok"] and verdict["severity"] == "degraded"
    assert verdict["missing_isas"] == ["avx512_bf16", "avx512_vnni", "amx_bf16"]
    for words in ("spr1", "0.13.0", "12.2.0", "amx_bf16", "toolchain_accept_degraded_isa: true"):
        assert words in verdict["message"]


def test_accepted_degradation_is_ok():
    verdict = compiler_verdict("0.13.0", "12.2.0", ICX_ISA, "x86_64", accept_degraded=True)
    assert verdict["ok"] and verdict["severity"] == "degraded" and verdict["missing_isas"] == ["avx512_vnni"]


def test_old_gcc_drops_nothing_on_an_avx2_host():
    verdict = compiler_verdict("0.13.0", "11.4.0", AVX2_ISA, "x86_64")
    assert verdict["ok"] and verdict["severity"] == "ok" and verdict["missing_isas"] == []


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_arm_has_no_compiler_gate(version):
    assert compiler_verdict(version, "12.2.0", ARM_ISA, "aarch64")["ok"]
