"""The build scenario: vLLM 0.32.0 compiled from its sdist once, installed on
two hosts of the class, serving the tiny model from the built wheel."""

import contextlib
import importlib.util
import io
import json
import os
import re
from pathlib import Path

import pytest

testinfra_hosts = ["build-debian12", "build-debian12-2"]

REPO = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
ARTIFACTS = REPO / ".cache" / "artifacts" / "x86_64"
BUILDER = "build-debian12"
VENV = "/opt/vllm/0.32.0-x86_64"
PATCHES = [
    "01-01-x86-gcc-check-12.2.patch",
    "02-02-flash-mla-static-constexpr.patch",
    "03-01-cpu-triton-fallback-signature.patch",
]


def _inspect(path):
    spec = importlib.util.spec_from_file_location("inspect_wheel", REPO / "roles/vllm_build/files/inspect_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module.main(str(path))
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def manifest():
    return json.loads((ARTIFACTS / "vllm-0.32.0.json").read_text())


@pytest.fixture(scope="module")
def built_version(manifest):
    return manifest["wheel_version"]


def test_the_manifest_describes_a_real_patched_build(host, manifest):
    found = _inspect(ARTIFACTS / manifest["wheel"])
    assert re.fullmatch(r"0\.32\.0\+cpu\.p[0-9a-f]{8}", manifest["wheel_version"])
    assert manifest["wheel"].startswith(f"vllm-{manifest['wheel_version']}-")
    assert found["sha256"] == manifest["sha256"] and found["version"] == manifest["wheel_version"]
    assert [p["name"] for p in manifest["patches"]] == PATCHES
    assert manifest["stand_in_wheel"] is None
    assert manifest["builder"] == BUILDER
    assert manifest["compiler"]["gcc_version"].startswith("12.2")
    assert manifest["build_seconds"] > 0
    assert found["url_requirements"] == [] and not [r for r in found["requires_dist"] if "github.com" in r]
    assert {"_C", "_C_AVX512", "_C_AVX2"} <= set(found["libraries"])


def test_only_the_builder_compiled(host):
    work = host.file("/var/lib/vllm-build/0.32.0-x86_64")
    assert work.is_directory == (host.backend.hostname == BUILDER)
    if host.backend.hostname == BUILDER:
        record = host.file("/var/lib/vllm-build/0.32.0-x86_64/src/.vllm-fleet-patches").content_string
        assert [entry.split()[0] for entry in record.split(", ")] == PATCHES


def test_vllm_version_reports_the_built_version(host, built_version):
    out = host.check_output(f"{VENV}/bin/vllm --version")
    assert out.strip().splitlines()[-1] == built_version


# The three libraries are builds of one torch library, `_C`, for different
# ISAs (AVX512 with BF16/VNNI/AMX, AVX512, AVX2). A process holds one of them:
# vLLM's CPU platform picks it (import_kernels); a second one aborts the process.
@pytest.mark.parametrize("library", ["_C", "_C_AVX512", "_C_AVX2"])
def test_each_kernel_library_loads_and_registers_the_ops(host, library):
    script = (
        "import glob, importlib.util, torch; "
        "pkg = importlib.util.find_spec('vllm').submodule_search_locations[0]; "
        f"torch.ops.load_library(glob.glob(pkg + '/{library}.*.so')[0]); "
        "print(torch.ops._C.silu_and_mul.default.name())"
    )
    assert host.check_output(f'{VENV}/bin/python -c "{script}"').strip() == "_C::silu_and_mul"


def test_vllm_loads_the_kernels_for_this_cpu_next_to_the_cpu_torch(host):
    script = (
        "import torch; from vllm.platforms import current_platform; current_platform.import_kernels(); "
        "print(torch.ops._C.silu_and_mul.default.name(), torch.__version__)"
    )
    out = host.check_output(f'{VENV}/bin/python -c "{script}"')
    assert out.strip().splitlines()[-1] == "_C::silu_and_mul 2.13.0+cpu"
