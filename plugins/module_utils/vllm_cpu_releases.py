"""What each supported vLLM release needs and means on CPU: the one version table.

Every fact below was read from the release's sdist; docs/vllm-releases.md cites
file and line for each. Roles, preflight and the planner ask this module;
nobody else compares version strings.
"""

import copy
import re

# 0.13 compiles only the ISA level it finds in the builder's /proc/cpuinfo; these
# variables force extensions on (cross-building), nothing can force one off except
# VLLM_CPU_DISABLE_AVX512=true, which drops the whole AVX512 block.
_V0_13_X86_BUILD_ENV = {
    "x86_64-amx": {"VLLM_CPU_AVX512BF16": "1", "VLLM_CPU_AVX512VNNI": "1", "VLLM_CPU_AMXBF16": "1"},
    "x86_64-avx512bf16": {"VLLM_CPU_AVX512BF16": "1", "VLLM_CPU_AVX512VNNI": "1"},
    "x86_64-avx512vnni": {"VLLM_CPU_AVX512VNNI": "1"},
    "x86_64-avx512": {},
    "x86_64-avx2": {"VLLM_CPU_DISABLE_AVX512": "true"},
    "aarch64-bf16": {},
    "aarch64-neon": {},
}

# 0.32+ builds one x86 wheel holding _C (AMX/AVX512-BF16/VNNI), _C_AVX512 and
# _C_AVX2 and imports the best one at run time; Arm still follows the builder's
# cpuinfo unless VLLM_CPU_ARM_BF16 / VLLM_CPU_ARM_I8MM force the extension on.
_V0_32_BUILD_ENV = {
    "x86_64": {},
    "aarch64-bf16-i8mm": {"VLLM_CPU_ARM_BF16": "1", "VLLM_CPU_ARM_I8MM": "1"},
    "aarch64-bf16": {"VLLM_CPU_ARM_BF16": "1"},
    "aarch64-neon": {},
}

_X86_BF16_ISAS = ["avx512_bf16", "avx512_vnni", "amx_bf16"]

# Debian 12's gcc 12.2 builds 0.32.0/0.33.0 with two patches (opt-in
# vllm_build_gcc122_workaround), applied by roles/vllm_build through its patch
# mechanism before the inventory's own vllm_build_patches: lower
# cpu_extension.cmake's FATAL gcc check, and make the constexpr local
# kBLOCK_H_MAX of sparse_mla_decode_kernel_impl (flash_mla.cpp:331, used as an
# array bound inside its parallel_for lambda) `static constexpr`: gcc 12.2
# otherwise dies there with an internal compiler error (flash_mla.cpp:349:27).
# `patch` is relative to roles/vllm_build/files/patches/; each applies without
# fuzz or stops the build, so a release whose source moved is never built
# half-patched.
_V0_32_GCC122_PATCHES = [
    {
        "patch": "gcc-12.2/01-x86-gcc-check-12.2.patch",
        "file": "cmake/cpu_extension.cmake",
        "why": 'FATAL_ERROR "X86 backend requires gcc/g++ >= 12.3" refuses gcc 12.2',
    },
    {
        "patch": "gcc-12.2/02-flash-mla-static-constexpr.patch",
        "file": "csrc/cpu/sgl-kernels/flash_mla.cpp",
        "why": "gcc 12.2 internal compiler error (lookup_template_class_1) on a constexpr local of a function "
        "template used as an array bound inside its parallel_for lambda",
    },
]

_V0_32_COMMON = {
    "min_gcc": "12.3",
    "min_cmake": "3.26.1",
    "gcc_below_min": "fatal",
    "isas_dropped_below_min": [],
    # Arm, s390x: cpu_extension.cmake has no compiler check for them.
    "gcc_by_arch": {
        "x86_64": {"below_min": "fatal", "isas_dropped": []},
        "aarch64": {"below_min": "degrade", "isas_dropped": []},
        "s390x": {"below_min": "degrade", "isas_dropped": []},
    },
    "universal_x86_wheel": True,
    "build_isa_env": _V0_32_BUILD_ENV,
    "env_vars": [
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_CPU_NUM_OF_RESERVED_CPU",
        "VLLM_CPU_ATTN_SPLIT_KV",
        "VLLM_CPU_INT4_W4A8",
        "VLLM_CPU_CI_ENV",
        "VLLM_CPU_SIM_MULTI_NUMA",
    ],
    "reserved_cpus_scope": "total",
    "auto_bind": {
        "x86_64": "highest-numbered sibling of each core",
        "aarch64": "every logical CPU",
        "reserved": "VLLM_CPU_NUM_OF_RESERVED_CPU in total (default: one per local rank), "
        "taken from the highest-numbered bound CPUs, last rank first",
    },
    "kvcache_unset": "--gpu-memory-utilization (default 0.92) x node MemTotal minus the worker's RSS",
    "has_sgl_kernel": False,
    "sgl_kernels_automatic_with_amx": True,
    "preloads_tcmalloc": True,
    "tcmalloc_bundled_from_builder": True,
    "preloads_iomp": False,
    "preloads_libgomp": ["x86_64", "aarch64", "s390x", "ppc64le"],
    "build_requirements": "requirements/build/cpu.txt",
    "runtime_requirements": "requirements/cpu.txt",
    # Pinned by a GitHub URL: unreachable from air-gapped builders.
    "runtime_requirements_github_urls": ["triton (triton-cpu 3.8.0)"],
    "python_versions": ["3.11", "3.12", "3.13", "3.14"],
    "cxx_standard": 20,
    # oneDNN commit vLLM's CMake clones (FETCHCONTENT_SOURCE_DIR_ONEDNN replaces the clone).
    "onednn_version": "3.13",
    # gcc major.minor -> patches that let it build this release (see above).
    "gcc_workarounds": {"12.2": _V0_32_GCC122_PATCHES},
}

RELEASES = {
    "0.13.0": {
        "version": "0.13.0",
        "min_gcc": "12.3",
        "min_cmake": "3.26.1",
        "gcc_below_min": "degrade",
        "isas_dropped_below_min": _X86_BF16_ISAS,
        "gcc_by_arch": {
            "x86_64": {"below_min": "degrade", "isas_dropped": _X86_BF16_ISAS},
            "aarch64": {"below_min": "degrade", "isas_dropped": []},
            "s390x": {"below_min": "degrade", "isas_dropped": []},
        },
        "universal_x86_wheel": False,
        "build_isa_env": _V0_13_X86_BUILD_ENV,
        "env_vars": [
            "VLLM_CPU_KVCACHE_SPACE",
            "VLLM_CPU_OMP_THREADS_BIND",
            "VLLM_CPU_NUM_OF_RESERVED_CPU",
            "VLLM_CPU_SGL_KERNEL",
            "VLLM_CPU_CI_ENV",
        ],
        "reserved_cpus_scope": "per_rank",
        "auto_bind": {
            "x86_64": "highest-numbered sibling of each core",
            "aarch64": "none (auto means nobind on Arm)",
            "reserved": "VLLM_CPU_NUM_OF_RESERVED_CPU per rank (default 0 when world_size is 1, "
            "else 1), taken from the highest-numbered CPUs of each rank",
        },
        "kvcache_unset": "50% of total RAM divided by the number of NUMA nodes",
        "has_sgl_kernel": True,
        "sgl_kernels_automatic_with_amx": False,
        "preloads_tcmalloc": False,
        "tcmalloc_bundled_from_builder": False,
        "preloads_iomp": False,
        "preloads_libgomp": ["aarch64", "ppc64le"],
        "build_requirements": "requirements/cpu-build.txt",
        "runtime_requirements": "requirements/cpu.txt",
        "runtime_requirements_github_urls": [],
        "torch_version": "2.9.1",
        "python_versions": ["3.10", "3.11", "3.12", "3.13"],
        "cxx_standard": 17,
        "onednn_version": None,  # not recorded
        # gcc 12.2 builds 0.13.0 unedited (degraded: see isas_dropped_below_min).
        "gcc_workarounds": {},
        "sdist_sha256": "4ad43db45fef37114b550d03a4f423fb3fa3a31d8bc09ee810ef8b9cdcd4b5fe",
        "git_tag": "v0.13.0",
    },
    # Same CPU knobs, build files, compiler check and torch pin as 0.32.0
    # (sdist diff: source paths of some kernels, setuptools pin, Python 3.10).
    "0.31.0": dict(
        _V0_32_COMMON,
        version="0.31.0",
        torch_version="2.13.0",
        python_versions=["3.10", "3.11", "3.12", "3.13", "3.14"],
        sdist_sha256="dde46f1efbe846e5bd0c5c4ec6ec71842c42254c7ff3d9bebb2a57028715d380",
        git_tag="v0.31.0",
    ),
    "0.32.0": dict(
        _V0_32_COMMON,
        version="0.32.0",
        torch_version="2.13.0",
        sdist_sha256="d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad",
        git_tag="v0.32.0",
    ),
    "0.33.0": dict(
        _V0_32_COMMON,
        version="0.33.0",
        torch_version="2.14.0",
        sdist_sha256="f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
        git_tag="v0.33.0",
    ),
}

# What to install when the compiler is too old; Debian 12's only gcc is 12.2.
GCC_FIX = (
    "install gcc-13 (Ubuntu 24.04), gcc-toolset-13 (RHEL 9), gcc-12 (12.4) or gcc-14 (Debian 13), "
    "or build this ISA class on a builder group host that has one; Debian 12 ships only 12.2"
)


class UnknownReleaseError(ValueError):
    """The requested vLLM version is not in RELEASES."""


def supported_versions():
    return sorted(RELEASES, key=_version_tuple)


def normalize_version(version):
    """Return "0.32.0" for "0.32.0", "v0.32.0" or " V0.32.0 "; raise for the rest."""
    text = str(version).strip()
    if text[:1] in ("v", "V"):
        text = text[1:]
    if text not in RELEASES:
        raise UnknownReleaseError(
            f"vLLM version {version!r} is not supported; supported versions: {', '.join(supported_versions())}"
        )
    return text


def release_info(version):
    """Return a copy of the release dict for ``version`` (callers may mutate it)."""
    return copy.deepcopy(RELEASES[normalize_version(version)])


def build_class(version, facts):
    """The wheel class a host needs: hosts with equal classes share one wheel."""
    release = RELEASES[normalize_version(version)]
    arch = facts["arch"]
    if arch == "x86_64" and release["universal_x86_wheel"]:
        return "x86_64"
    isa = facts["isa"]
    if arch == "aarch64" and "aarch64-bf16-i8mm" in release["build_isa_env"] and isa.get("bf16") and isa.get("i8mm"):
        return "aarch64-bf16-i8mm"
    return facts["isa_class"]


def build_isa_env(version, wheel_class):
    """The release's ISA build variables for a wheel class ({} when it has none)."""
    return dict(RELEASES[normalize_version(version)]["build_isa_env"].get(wheel_class, {}))


def _version_tuple(text):
    """(12, 2, 0) for "12.2.0", "12.2" or "12.2.0-14"; (0, 0, 0) when unparsable."""
    match = re.match(r"\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(text))
    if not match:
        return (0, 0, 0)
    return tuple(int(part or 0) for part in match.groups())


def compiler_verdict(vllm_version, gcc_version, isa, arch, accept_degraded=False, host=""):
    """Decide whether gcc ``gcc_version`` can build ``vllm_version`` for this host.

    Returns {ok, severity ("ok"|"degraded"|"fatal"), min_gcc, missing_isas, message}.
    missing_isas are the host's own ISAs the build would silently leave out.
    """
    release = RELEASES[normalize_version(vllm_version)]
    min_gcc = release["min_gcc"]
    verdict = {"ok": True, "severity": "ok", "min_gcc": min_gcc, "missing_isas": [], "message": ""}
    if _version_tuple(gcc_version) >= _version_tuple(min_gcc):
        verdict["message"] = f"gcc {gcc_version} meets vLLM {release['version']}'s minimum {min_gcc}"
        return verdict
    where = f"{host}: " if host else ""
    found = f"vLLM {release['version']} needs gcc >= {min_gcc} but gcc {gcc_version} was found"
    policy = release["gcc_by_arch"].get(arch, {"below_min": "degrade", "isas_dropped": []})
    if policy["below_min"] == "fatal":
        verdict.update(
            ok=False,
            severity="fatal",
            message=f"{where}{found} (its cmake/cpu_extension.cmake stops with FATAL_ERROR on {arch}); fix: {GCC_FIX}",
        )
        return verdict
    missing = [name for name in policy["isas_dropped"] if isa.get(name)]
    verdict["missing_isas"] = missing
    if not missing:
        verdict["message"] = f"{where}{found}; nothing this {arch} host uses is dropped"
        return verdict
    lost = ", ".join(missing)
    if accept_degraded:
        verdict.update(
            severity="degraded",
            message=f"{where}{found}; building without {lost} (accepted by toolchain_accept_degraded_isa)",
        )
        return verdict
    verdict.update(
        ok=False,
        severity="degraded",
        message=f"{where}{found}; the build would silently drop {lost} that this host has; fix: {GCC_FIX}, "
        "or set toolchain_accept_degraded_isa: true to accept the slower build",
    )
    return verdict
