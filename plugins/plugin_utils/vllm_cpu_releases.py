"""What each supported vLLM release needs and means on CPU: the one version table.

The rows live in vllm_cpu_releases.json beside this module, generated from each
release's own sdist by the release probe (vllm_cpu_release_probe.py;
its command line tools/vllm_release_probe.py, run by playbooks/release_probe.yml) and checked against the sdists by
tests/integration/test_release_table.py; docs/vllm-releases.md cites file and
line for every change of meaning. What is not in a release's source (the
patches this project carries for old compilers) is added here. An inventory
adds or replaces rows with ``vllm_release_overrides`` ({version: row}, the
probe's ``--as-inventory`` output), validated like a built-in row. Roles,
preflight and the planner ask this module; nobody else compares version strings.
"""

import contextlib
import copy
import json
import re
from pathlib import Path

try:
    from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_syntax as syntax
except ImportError:  # scripts/wheelhouse.py imports this file by itself, from this directory
    import vllm_syntax as syntax

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

_ROWS_FILE = Path(__file__).with_name("vllm_cpu_releases.json")
with open(_ROWS_FILE, encoding="utf-8") as _handle:
    _ROWS = json.load(_handle)

# gcc major.minor -> patches that let it build the release (see above); not in
# any sdist, so not derived by the probe. Checked by tests/integration/test_build_patches.py.
GCC_WORKAROUNDS = {
    "0.31.0": {"12.2": _V0_32_GCC122_PATCHES},
    "0.32.0": {"12.2": _V0_32_GCC122_PATCHES},
    "0.33.0": {"12.2": _V0_32_GCC122_PATCHES},
}


def _version_tuple(text):
    """(12, 2, 0) for "12.2.0", "12.2" or "12.2.0-14"; (0, 0, 0) when unparsable."""
    match = re.match(r"\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(text))
    if not match:
        return (0, 0, 0)
    return tuple(int(part or 0) for part in match.groups())


# The prebuilt CPU distributions on the package index, per release: not in any sdist, so not derived
# by the probe. `pip index versions vllm-cpu` lists 0.13.0 to 0.32.0 (every table release up to it,
# 0.15.0 and 0.15.1 included), each with x86_64 and aarch64 wheels, and no 0.33.0. x86_64_isa is what
# the x86_64 wheel's code is built for: "avx2" (one vllm/_C.abi3.so without a single zmm instruction
# and without the SGL kernel ops, convert_weight_packed and the rest: checked in the 0.13.0, 0.14.0,
# 0.14.1, 0.15.0, 0.15.1 and 0.16.0 wheels) or "universal" (_C built for AVX512-BF16/AMX, holding the
# ops, beside _C_AVX2 and from 0.18.0 _C_AVX512, picked at import: checked in 0.17.0, 0.20.0, 0.27.1).
_PREBUILT_RANGE = {"vllm-cpu": ("0.13.0", "0.32.0")}
_PREBUILT_ARCHES = ["aarch64", "x86_64"]


def _prebuilt(version, row):
    """The row's prebuilt distributions: {name: {arches, x86_64_isa}}."""
    return {
        name: {"arches": list(_PREBUILT_ARCHES), "x86_64_isa": "universal" if row["universal_x86_wheel"] else "avx2"}
        for name, (low, high) in _PREBUILT_RANGE.items()
        if _version_tuple(low) <= _version_tuple(version) <= _version_tuple(high)
    }


def _built_in(version, row):
    return dict(
        row,
        gcc_workarounds=copy.deepcopy(GCC_WORKAROUNDS.get(version, {})),
        prebuilt=_prebuilt(version, row),
    )


RELEASES = {version: _built_in(version, row) for version, row in _ROWS.items()}

# The release probe as the fix messages name it: a playbook of this collection, so the same command works from a
# checkout and from an installed copy (tools/ is not on an operator's path).
PROBE_COMMAND = (
    "ansible-playbook vllm.cpu_fleet.release_probe -e vllm_release_probe_version={version}"
    " -e vllm_release_probe_dest=group_vars/all/vllm_release.yml"
)


def probe_command(version):
    """PROBE_COMMAND for ``version``, or for X.Y.Z when it is not a release version the probe takes."""
    text = str(version)
    return PROBE_COMMAND.format(version=text if re.fullmatch(r"\d+\.\d+\.\d+", text) else "X.Y.Z")


OVERRIDES_VARIABLE = "vllm_release_overrides"

# The row format: key -> check(value) returning an error text or None.
_ARCHES = ("x86_64", "aarch64", "s390x")
_ENV_TYPES = ("int", "bool", "str")
_ENV_EXTRA = {"scope": ("per_rank", "total"), "unset": ("half_of_ram_per_node", "gpu_memory_utilization")}
_SERVE = ("vllm serve", "python -m vllm.entrypoints.openai.api_server")
# Which NUMA nodes a worker binds its memory to: the nodes of all its bound CPUs
# (to 0.19.1), or the node of its first bound CPU (0.20.0+).
MEMORY_BINDINGS = ("bound_cpu_nodes", "first_cpu_node")


# What to install when the compiler is too old; Debian 12's only gcc is 12.2.
GCC_FIX = (
    "install gcc-13 (Ubuntu 24.04), gcc-toolset-13 (RHEL 9), gcc-12 (12.4) or gcc-14 (Debian 13), "
    "or build this ISA class on a builder group host that has one; Debian 12 ships only 12.2"
)


class UnknownReleaseError(ValueError):
    """The requested vLLM version is in neither RELEASES nor the inventory's overrides."""


class InvalidReleaseRowError(ValueError):
    """A row of vllm_release_overrides is not in the table's format."""

    def __init__(self, problems):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


# ----------------------------------------------------------------- the row format


def _is_str(value):
    return isinstance(value, str) and value != ""


def _str_list(value):
    return isinstance(value, list) and all(_is_str(item) for item in value)


def _str_map(value):
    return isinstance(value, dict) and all(_is_str(k) and isinstance(v, str) for k, v in value.items())


def _check_gcc_by_arch(value):
    if not isinstance(value, dict) or not value:
        return "a dict {arch: {below_min, isas_dropped}}"
    for arch, policy in value.items():
        if (
            not isinstance(policy, dict)
            or set(policy) != {"below_min", "isas_dropped"}
            or policy["below_min"] not in ("fatal", "degrade")
            or not _str_list(policy["isas_dropped"])
        ):
            return f"{arch}: {{below_min: fatal|degrade, isas_dropped: [isa, ...]}}"
    missing = [arch for arch in _ARCHES if arch not in value]
    return f"no policy for {', '.join(missing)}" if missing else None


def _check_env_vars(value):
    if not isinstance(value, dict) or not value:
        return "a dict {VLLM_CPU_NAME: {type, default}}"
    for name, spec in value.items():
        # Each name becomes a line `NAME="value"` of every instance's environment file.
        if not isinstance(name, str) or not name.startswith("VLLM_CPU_") or syntax.env_name(name):
            return f"{name!r} is not a VLLM_CPU_* name (letters, digits and _ only)"
        if not isinstance(spec, dict) or spec.get("type") not in _ENV_TYPES:
            return f"{name}: type must be one of {', '.join(_ENV_TYPES)}"
        if "default" not in spec or not (spec["default"] is None or isinstance(spec["default"], str)):
            return f"{name}: default must be a string or null"
        values = [spec["default"], *(spec.get("choices") or [])]
        refused = [item for item in values if item is not None and syntax.env_file_value(str(item))]
        if refused:
            return f"{name}: {refused[0]!r} is not printable ASCII on one line (the environment file's values)"
        for key, item in spec.items():
            if key in ("type", "default", "choices"):
                continue
            if key not in _ENV_EXTRA or item not in _ENV_EXTRA[key]:
                allowed = ", ".join(f"{k}: {'|'.join(v)}" for k, v in _ENV_EXTRA.items())
                return f"{name}: unknown {key}: {item!r} (known: {allowed})"
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"):
        if name not in value:
            return f"no {name} (every release reads it; the plan sets it)"
    return None


def _check_cpu_libraries(value):
    shape = '{"x86_64": ["_C", ...], "other": ["_C", ...]} (setup.py\'s CPU extensions)'
    if not isinstance(value, dict) or set(value) != {"x86_64", "other"}:
        return shape
    if not all(_str_list(names) and names and all(name.startswith("_C") for name in names) for names in value.values()):
        return shape
    return None


# A wheel class names directories (<work root>/<version>-<class>, <artifacts>/<class>): one path component.
_CLASS_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")


def _check_build_isa_env(value):
    if not isinstance(value, dict) or not value:
        return "a dict {wheel class: {VARIABLE: value}}"
    bad = [name for name, env in value.items() if not _is_str(name) or not _str_map(env)]
    if bad:
        return f"not a dict of strings: {', '.join(map(str, bad))}"
    for wheel_class, env in value.items():
        if not _CLASS_NAME.match(wheel_class):
            return f"{wheel_class!r} is not a wheel class name (letters, digits and _ . + -; it names directories)"
        # build.sh writes each as `export NAME=<value | quote>`: a name that is not one runs as a command.
        for name, item in env.items():
            # cmake/cpu_extension.cmake reads them as $ENV{VLLM_CPU_*}; another name (PATH, BASH_ENV) is no ISA switch.
            if syntax.env_name(name) or not name.startswith("VLLM_CPU_"):
                return f"{wheel_class}: {name!r} is not a variable name VLLM_CPU_* (letters, digits and _)"
            if syntax.shell_value(item):
                return f"{wheel_class}: {name}: the value has a NUL character, which no shell variable holds"
    return None


def _check_gcc_workarounds(value):
    if not isinstance(value, dict):
        return "a dict {gcc major.minor: [{patch, file, why}]}"
    for gcc, patches in value.items():
        if not re.fullmatch(r"\d+\.\d+", str(gcc)) or not isinstance(patches, list):
            return f"{gcc!r}: a gcc major.minor and a list of patches"
        if not all(isinstance(p, dict) and _is_str(p.get("patch")) and _is_str(p.get("file")) for p in patches):
            return f"{gcc}: each patch needs patch and file"
        # patch: under roles/vllm_build/files/patches/; file: inside the source tree.
        for item in patches:
            for key in ("patch", "file"):
                if syntax.relative_path(item[key]):
                    return f"{gcc}: {key} {item[key]!r} is not a relative path inside its tree (no .., no blanks)"
    return None


_VERSION_RE = r"\d+\.\d+\.\d+"
X86_ISAS = ("avx2", "universal")


def _check_prebuilt(value):
    shape = '{"vllm-cpu": {"arches": ["aarch64", "x86_64"], "x86_64_isa": "avx2|universal"}} (the index\'s wheels)'
    if not isinstance(value, dict):
        return shape
    for name, wheel in value.items():
        if not (_is_str(name) and syntax.DISTRIBUTION_NAME.match(name)) or not isinstance(wheel, dict):
            return shape
        if set(wheel) != {"arches", "x86_64_isa"} or not _str_list(wheel["arches"]) or not wheel["arches"]:
            return shape
        if wheel["x86_64_isa"] not in X86_ISAS:
            return shape
    return None


def _check_wheel_only(value):
    shape = "null, or {wheel, sha256, keys_from, keys} (a row derived from a wheel: the release has no sdist)"
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"wheel", "sha256", "keys_from", "keys"}:
        return shape
    if not (_is_str(value["wheel"]) and value["wheel"].endswith(".whl") and "/" not in value["wheel"]):
        return shape
    if not (isinstance(value["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", value["sha256"])):
        return shape
    if not (isinstance(value["keys_from"], str) and re.fullmatch(_VERSION_RE, value["keys_from"])):
        return shape
    return None if _str_list(value["keys"]) else shape


def _check_cpu_libraries_names(value):
    problem = _check_cpu_libraries(value)
    if problem:
        return problem
    names = [name for names in value.values() for name in names]
    bad = [name for name in names if not re.fullmatch(r"_C[A-Za-z0-9_]*", name)]
    return f"{bad[0]!r} is not a module name such as _C_AVX2" if bad else None


def _relative(value, example):
    refusal = syntax.relative_path(value)
    return f"a path inside the source, e.g. {example} ({refusal.problem})" if refusal else None


ROW_FORMAT = {
    "version": lambda v: None if isinstance(v, str) and re.fullmatch(_VERSION_RE, v) else "X.Y.Z",
    "git_tag": lambda v: None if _is_str(v) and not syntax.git_ref(v) else "a git tag, e.g. v0.34.0 (not - first)",
    "sdist_sha256": lambda v: (
        None
        if v is None or (isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v))
        else "64 lowercase hex digits or null"
    ),
    "torch_version": lambda v: (
        None
        if isinstance(v, str) and re.fullmatch(r"\d+\.\d+(\.\d+)?", v)
        else "a torch version such as 2.14.0 (without +cpu)"
    ),
    "torch_plus_cpu_arches": lambda v: (
        None
        if _str_list(v) and all(re.fullmatch(r"[A-Za-z0-9_]+", a) for a in v)
        else 'a list of machines such as ["aarch64", "x86_64"]'
    ),
    "python_versions": lambda v: (
        None if v and _str_list(v) and all(re.fullmatch(r"3\.\d+", p) for p in v) else 'a list such as ["3.11", "3.12"]'
    ),
    "min_gcc": lambda v: None if isinstance(v, str) and re.fullmatch(r"\d+\.\d+", v) else "major.minor, e.g. 12.3",
    "min_cmake": lambda v: None if isinstance(v, str) and re.fullmatch(r"\d+(\.\d+)*", v) else "e.g. 3.26.1",
    "gcc_by_arch": _check_gcc_by_arch,
    "universal_x86_wheel": lambda v: None if isinstance(v, bool) else "true or false",
    "cpu_libraries": _check_cpu_libraries_names,
    "build_isa_env": _check_build_isa_env,
    "env_vars": _check_env_vars,
    "build_requirements": lambda v: _relative(v, "requirements/build/cpu.txt"),
    "runtime_requirements": lambda v: _relative(v, "requirements/cpu.txt"),
    "serve_entrypoint": lambda v: None if v in _SERVE else " or ".join(_SERVE),
    "serve_cli_distribution": lambda v: (
        None
        if v is None or (_is_str(v) and syntax.DISTRIBUTION_NAME.match(v))
        else "the distribution name vllm/entrypoints/cli/main.py looks up (vllm), or null"
    ),
    "api_server_module": lambda v: None if isinstance(v, bool) else "true or false",
    "preloads_iomp": lambda v: None if isinstance(v, bool) else "true or false",
    "memory_binding": lambda v: None if v in MEMORY_BINDINGS else " or ".join(MEMORY_BINDINGS),
    "gcc_workarounds": _check_gcc_workarounds,
    "prebuilt": _check_prebuilt,
    "wheel_only": _check_wheel_only,
}
# Keys a row may leave out, with their value then (an override row without prebuilt gets the index's wheels of its
# version, see table()).
ROW_OPTIONAL = {"gcc_workarounds": {}, "prebuilt": {}, "wheel_only": None}


def validate_row(version, row, where=OVERRIDES_VARIABLE):
    """Every problem with one row ([] when it is in the table's format)."""
    name = f"{where}[{version!r}]"
    fix = f"fix: regenerate the row with `{probe_command(version)}`"
    if not isinstance(row, dict):
        return [f"{name}: not a dict of the release table's keys; {fix}"]
    problems = []
    for key in sorted(set(ROW_FORMAT) - set(row) - set(ROW_OPTIONAL)):
        problems.append(f"{name}: missing key {key}; {fix}")
    for key in sorted(set(row) - set(ROW_FORMAT)):
        problems.append(f"{name}: unknown key {key} (known: {', '.join(ROW_FORMAT)}); {fix}")
    for key, check in ROW_FORMAT.items():
        if key in row:
            error = check(row[key])
            if error:
                problems.append(f"{name}.{key}: {row[key]!r} is not valid: expected {error}; {fix}")
    if isinstance(row.get("version"), str) and row["version"] != version:
        problems.append(f"{name}.version: {row['version']!r} differs from the key {version!r}; {fix}")
    if not problems and row["serve_entrypoint"] != "vllm serve" and not row["api_server_module"]:
        problems.append(f"{name}.api_server_module: false, and serve_entrypoint is the module form; {fix}")
    return problems


# ----------------------------------------------------------------- overrides

_ACTIVE_OVERRIDES = [None]
# Merged tables by the overrides' canonical form. Every lookup of a plan (version, class, route, torch, ...) asks
# for the table; from Ansible, the overrides are its tagged, lazy values, whose deep copy costs milliseconds per
# value: merged once per distinct overrides (per process), not once per lookup.
_MERGED = {}
_MERGED_MAX = 16


def _shown(value):
    """A value as the inventory wrote it, cut short (standard library only: scripts/wheelhouse.py imports this file
    by itself)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _strip_v(text):
    text = str(text).strip()
    return text[1:] if text[:1] in ("v", "V") else text


def _canonical(value):
    """A hashable form of the overrides that keeps each value's type (1 and "1", a list and a tuple differ),
    or None for a type it does not know (then nothing is cached)."""
    if isinstance(value, bool) or value is None:
        return (type(value).__name__, value)
    for kind in (str, int, float):
        if isinstance(value, kind):
            return (kind.__name__, kind(value))
    if isinstance(value, dict):
        items = [(_canonical(k), _canonical(v)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return ("dict", tuple(sorted(items, key=repr)))
    if isinstance(value, (list, tuple)):
        items = tuple(_canonical(v) for v in value)
        return None if None in items else (type(value).__name__, items)
    return None


def table(overrides=None):
    """The built-in rows with the inventory's validated overrides merged over them (a row replaces a row)."""
    overrides = _ACTIVE_OVERRIDES[-1] if overrides is None else overrides
    if not overrides:
        return RELEASES
    if not isinstance(overrides, dict):
        fix = f"fix: generate it with `{probe_command('X.Y.Z')}`"
        raise InvalidReleaseRowError([f"{OVERRIDES_VARIABLE}: {_shown(overrides)} is not a dict; {fix}"])
    key = _canonical(overrides)
    if key is not None and key in _MERGED:
        return _MERGED[key]
    merged = dict(RELEASES)
    problems = []
    for version_key, row in overrides.items():
        version = _strip_v(version_key)
        if isinstance(row, dict) and "version" in row:
            row = dict(row, version=_strip_v(row["version"]))
        found = validate_row(version, row)
        if found:
            problems.extend(found)
            continue
        merged[version] = dict(copy.deepcopy(ROW_OPTIONAL), **copy.deepcopy(row))
        if "prebuilt" not in row:  # what the index has is the version's, not the source's: the probe cannot say
            merged[version]["prebuilt"] = _prebuilt(version, merged[version])
    if problems:
        raise InvalidReleaseRowError(problems)
    if key is not None:
        if len(_MERGED) >= _MERGED_MAX:
            _MERGED.clear()
        _MERGED[key] = merged
    return merged


def replaced_row_warnings(overrides):
    """What an override of a release the table knows changes (a row replaces the whole built-in row): one warning per
    such row naming the fields it changes, so that a row copied for another release, or left from an older table,
    does not silently move a known release's tag, torch or flags. A row for a release the table lacks: nothing."""
    said = []
    for version_key, row in (overrides if isinstance(overrides, dict) else {}).items():
        version = _strip_v(version_key)
        built_in = RELEASES.get(version)
        if built_in is None or not isinstance(row, dict):
            continue
        fields = set(row) - {"version"}
        changed = sorted(name for name in fields if built_in.get(name, ROW_OPTIONAL.get(name)) != row[name])
        dropped = sorted(set(built_in) - set(row) - set(ROW_OPTIONAL) - {"version"})
        if changed or dropped:
            what = ", ".join(
                ([f"changes {', '.join(changed)}"] if changed else [])
                + ([f"leaves out {', '.join(dropped)}"] if dropped else [])
            )
            said.append(
                f"{OVERRIDES_VARIABLE}: {version} replaces the table's row of a release it knows and {what}: the"
                " plans, builds and installs of that release follow the override. If that is meant (a patched tag, a"
                " newer torch), nothing to do; else remove the row."
            )
    return said


@contextlib.contextmanager
def release_overrides(overrides):
    """Within the block, every lookup here also sees ``overrides`` (for callers that cannot pass them)."""
    table(overrides or {})  # validate before anything reads them
    _ACTIVE_OVERRIDES.append(overrides or {})
    try:
        yield
    finally:
        _ACTIVE_OVERRIDES.pop()


def supported_versions(overrides=None):
    return sorted(table(overrides), key=_version_tuple)


def normalize_version(version, overrides=None):
    """Return "0.32.0" for "0.32.0", "v0.32.0" or " V0.32.0 "; raise for the rest."""
    text = _strip_v(version)
    if text not in table(overrides):
        raise UnknownReleaseError(
            f"vLLM version {version!r} is not supported; supported versions: "
            f"{', '.join(supported_versions(overrides))}; a newer tag's row comes from its source: "
            f"`{probe_command(text)}` (sets {OVERRIDES_VARIABLE})"
        )
    return text


def release_info(version, overrides=None):
    """Return a copy of the release dict for ``version`` (callers may mutate it)."""
    return copy.deepcopy(table(overrides)[normalize_version(version, overrides)])


def build_class(version, facts, overrides=None):
    """The wheel class a host needs: hosts with equal classes share one wheel."""
    release = table(overrides)[normalize_version(version, overrides)]
    arch = facts["arch"]
    if arch == "x86_64" and release["universal_x86_wheel"]:
        return "x86_64"
    isa = facts["isa"]
    if arch == "aarch64" and "aarch64-bf16-i8mm" in release["build_isa_env"] and isa.get("bf16") and isa.get("i8mm"):
        return "aarch64-bf16-i8mm"
    return facts["isa_class"]


def build_isa_env(version, wheel_class, overrides=None):
    """The release's ISA build variables for a wheel class ({} when it has none)."""
    release = table(overrides)[normalize_version(version, overrides)]
    return dict(release["build_isa_env"].get(wheel_class, {}))


# VLLM_CPU_SGL_KERNEL=1 (0.13.0-0.27.1) makes every unquantized linear layer call
# torch.ops._C.convert_weight_packed (0.13.0 vllm/model_executor/layers/utils.py:201-202), an op compiled
# only into a build with both of these (0.13.0 cmake/cpu_extension.cmake:364-378): without it, loading fails.
SGL_KERNEL_ISAS = ("avx512_bf16", "avx512_vnni")
INSTALL_SOURCES = ("index", "wheel")


def installed_build(version, facts, source, package, accept_degraded=False, overrides=None):
    """What code a host of these facts runs on an install route, and whether it holds the SGL kernel ops.

    source "index": the package index's prebuilt ``package`` wheel (the row's prebuilt): its x86_64 code is
    "avx2" or "universal" (None: the index has no such wheel, which preflight refuses). source "wheel": a
    wheel built by roles/vllm_build for the host's build class; with ``accept_degraded``
    (toolchain_accept_degraded_isa) a release whose x86 gcc check degrades may be built without the ISAs
    that check drops, so they are not counted on. Returns {source, distribution, code, sgl_kernel_ops, note}.
    """
    release = table(overrides)[normalize_version(version, overrides)]
    arch, isa = facts["arch"], facts.get("isa") or {}
    has_sgl_isas = arch == "x86_64" and all(isa.get(name) for name in SGL_KERNEL_ISAS)
    if source == "index":
        wheel = release["prebuilt"].get(package)
        if not wheel or arch not in wheel["arches"]:
            note = (f"the package index has no {package} {release['version']} wheel for {arch}; "
                    "vllm_install_source: wheel builds one")  # fmt: skip
            return {"source": source, "distribution": package, "code": None, "sgl_kernel_ops": False, "note": note}
        code = wheel["x86_64_isa"] if arch == "x86_64" else arch
        note = None
        if code == "avx2" and isa.get("avx512f"):
            note = (f"the index's {package} {release['version']} x86_64 wheel is an AVX2-only build: this "
                    f"{facts['isa_class']} host runs AVX2 kernels (slower, not wrong); vllm_install_source: wheel "
                    f"builds class {build_class(version, facts, overrides)} for it")  # fmt: skip
        return {"source": source, "distribution": package, "code": code,
                "sgl_kernel_ops": has_sgl_isas and code == "universal", "note": note}  # fmt: skip
    wheel_class = build_class(version, facts, overrides)
    policy = release["gcc_by_arch"].get(arch, {"below_min": "fatal", "isas_dropped": []})
    dropped = [name for name in policy["isas_dropped"] if isa.get(name)] if accept_degraded else []
    note = None
    if dropped and policy["below_min"] == "degrade":
        note = (f"toolchain_accept_degraded_isa lets a builder with gcc below {release['min_gcc']} build class "
                f"{wheel_class} without {', '.join(dropped)}: the plan does not count on them")  # fmt: skip
    else:
        dropped = []
    return {"source": source, "distribution": "vllm", "code": wheel_class,
            "sgl_kernel_ops": has_sgl_isas and not set(dropped) & set(SGL_KERNEL_ISAS), "note": note}  # fmt: skip


def prebuilt_versions(package, arch, overrides=None):
    """The releases whose prebuilt ``package`` wheel the index has for ``arch``, oldest first."""
    return [
        version
        for version in supported_versions(overrides)
        if arch in table(overrides)[version]["prebuilt"].get(package, {}).get("arches", [])
    ]


def routes(version, overrides=None):
    """How a release can be installed, and what its row was derived from.

    {"index": [prebuilt distributions], "wheel": "sdist" or "git tag" (what vllm_build compiles: a release
    without an sdist digest, wheel-only or from a tag tarball, only from its tag, vllm_build_source: git),
    "row_from": "sdist", "source" (a tag tarball or directory) or "wheel" (wheel-only: some keys are the
    nearest release's)}.
    """
    release = table(overrides)[normalize_version(version, overrides)]
    return {
        "index": sorted(release["prebuilt"]),
        "wheel": "sdist" if release["sdist_sha256"] else "git tag",
        "row_from": "wheel" if release["wheel_only"] else "sdist" if release["sdist_sha256"] else "source",
    }


def wheel_libraries(vllm_version, arch, overrides=None):
    """The compiled vllm/_C* modules a CPU wheel of ``vllm_version`` built on ``arch`` holds (sorted).

    setup.py lists them for x86_64 and for every other machine (cpu_libraries):
    _C alone up to 0.16, _C and _C_AVX2 in 0.17.x, _C, _C_AVX2 and _C_AVX512 from 0.18.0.
    """
    if not _is_str(arch):
        raise ValueError(f"arch: {arch!r} is not an architecture name; fix: pass ansible_facts.vllm_cpu.arch")
    release = table(overrides)[normalize_version(vllm_version, overrides)]
    return list(release["cpu_libraries"]["x86_64" if arch == "x86_64" else "other"])


def torch_pin(vllm_version, arch, overrides=None):
    """The torch version a release builds and runs with on ``arch``, as its requirements/cpu.txt pins it.

    "2.13.0+cpu" (PyTorch's CPU index) on the machines of the release's +cpu pin
    (torch_plus_cpu_arches: x86_64 and s390x, and aarch64 from 0.20.0), else "2.13.0"
    (PyPI's torch, a CPU build on those machines).
    """
    if not _is_str(arch):
        raise ValueError(f"arch: {arch!r} is not an architecture name; fix: pass ansible_facts.vllm_cpu.arch")
    release = table(overrides)[normalize_version(vllm_version, overrides)]
    return release["torch_version"] + ("+cpu" if arch in release["torch_plus_cpu_arches"] else "")


def _gcc_minor(gcc_version):
    """The major.minor ("12.2") of "12.2.0", "12.2" or "12.2.0-14"; None when there is none."""
    match = re.match(r"\s*(\d+\.\d+)", str(gcc_version))
    return match.group(1) if match else None


def compiler_verdict(
    vllm_version,
    gcc_version,
    isa,
    arch,
    accept_degraded=False,
    host="",
    overrides=None,
    accept_workaround=False,
    distribution=None,
    compilers=None,
):
    """Decide whether gcc ``gcc_version`` can build ``vllm_version`` for this host.

    Returns {ok, severity ("ok"|"degraded"|"fatal"|"patched"), min_gcc, missing_isas, patches, message}.
    missing_isas are the host's own ISAs the build would silently leave out. A gcc the
    release refuses is accepted with the release's gcc_workarounds for it when
    ``accept_workaround`` (vllm_build_gcc122_workaround): severity "patched", and
    ``patches`` are what roles/vllm_build applies before compiling.

    With ``distribution`` (the name of the host's roles/toolchain/vars file, e.g.
    "Debian-12": the compiler is what that distribution installs) and ``compilers``
    ({vars file name: gcc version} of every supported distribution), a refusal reads
    ``host: vllm_version: ...; fix: ...`` and names the distributions that meet the minimum.
    """
    verdict = _verdict(vllm_version, gcc_version, isa, arch, accept_degraded, host, overrides, accept_workaround)
    if distribution and not verdict["ok"]:
        verdict["message"] = _distribution_message(
            table(overrides)[normalize_version(vllm_version, overrides)], verdict, gcc_version, arch, host,
            distribution, compilers or {},
        )  # fmt: skip
    return verdict


def _distribution_message(release, verdict, gcc_version, arch, host, distribution, compilers):
    where = f"{host}: " if host else ""
    if verdict["severity"] == "fatal":
        why = "its cmake/cpu_extension.cmake stops with FATAL_ERROR below it"
    else:
        why = f"below it the build silently drops {', '.join(verdict['missing_isas'])}, which this host has"
    able = [f"{name} (gcc {gcc})" for name, gcc in sorted(compilers.items())
            if _version_tuple(gcc) >= _version_tuple(release["min_gcc"])]  # fmt: skip
    fixes = [
        f"build this class on a builder group host running {', '.join(able)}" if able
        else "add a roles/toolchain/vars file for a distribution whose gcc meets it (none of the supported ones does)"
    ]  # fmt: skip
    if release["gcc_workarounds"].get(_gcc_minor(gcc_version)):
        fixes.append("set vllm_build_gcc122_workaround: true (the release table's patches, see docs/build.md)")
    if verdict["severity"] == "degraded":
        fixes.append("set toolchain_accept_degraded_isa: true to accept the slower build")
    return (
        f"{where}vllm_version: vLLM {release['version']} needs gcc >= {release['min_gcc']} on {arch} ({why}), and "
        f"{distribution} installs gcc {gcc_version} (roles/toolchain/vars/{distribution}.yml); "
        f"fix: {', or '.join(fixes)}"
    )


def _verdict(vllm_version, gcc_version, isa, arch, accept_degraded, host, overrides, accept_workaround):
    if not isinstance(isa, dict):
        raise ValueError(f"isa: {_shown(isa)} is not a dict of ISA flags; fix: pass ansible_facts.vllm_cpu.isa")
    for name, value in (("accept_degraded", accept_degraded), ("accept_workaround", accept_workaround)):
        if not isinstance(value, bool):
            raise ValueError(f"{name}: {value!r} is not a boolean; fix: pass true or false")
    if not _is_str(arch):
        raise ValueError(f"arch: {arch!r} is not an architecture name; fix: pass ansible_facts.vllm_cpu.arch")
    release = table(overrides)[normalize_version(vllm_version, overrides)]
    verdict = _verdict_without_workaround(release, gcc_version, isa, arch, accept_degraded, host)
    workaround = release["gcc_workarounds"].get(_gcc_minor(gcc_version), [])
    verdict["patches"] = []
    if verdict["ok"] or not workaround:
        return verdict
    if accept_workaround:
        where = f"{host}: " if host else ""
        verdict.update(
            ok=True,
            severity="patched",
            patches=copy.deepcopy(workaround),
            message=f"{where}building vLLM {release['version']} with gcc {gcc_version} below its minimum "
            f"{release['min_gcc']} (vllm_build_gcc122_workaround: true); patching "
            f"{', '.join(p['file'] for p in workaround)} with {', '.join(p['patch'] for p in workaround)}: "
            f"{'; '.join(p.get('why', '') for p in workaround)}",
        )
        return verdict
    verdict["message"] += (
        "; or, for this gcc, set vllm_build_gcc122_workaround: true (the release table's patches, see docs/build.md)"
    )
    return verdict


def _verdict_without_workaround(release, gcc_version, isa, arch, accept_degraded, host):
    min_gcc = release["min_gcc"]
    verdict = {"ok": True, "severity": "ok", "min_gcc": min_gcc, "missing_isas": [], "message": ""}
    if _version_tuple(gcc_version) >= _version_tuple(min_gcc):
        verdict["message"] = f"gcc {gcc_version} meets vLLM {release['version']}'s minimum {min_gcc}"
        return verdict
    where = f"{host}: " if host else ""
    found = f"vLLM {release['version']} needs gcc >= {min_gcc} but gcc {gcc_version} was found"
    # No row has a check for ppc64le: cpu_extension.cmake tests gcc on x86 only.
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
