"""Verifies the toolchain role on the converged containers."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "collections"))  # the collection, through the checkout's link
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import release_info  # noqa: E402

FACT_FILE = "/etc/ansible/facts.d/vllm_toolchain.fact"


def version_tuple(text):
    return tuple(int(part) for part in text.split(".")[:2])


@pytest.fixture()
def toolchain(host):
    return json.loads(host.file(FACT_FILE).content_string)


def test_recorded_compiler_is_the_one_installed(host, toolchain):
    reported = host.check_output(f"{toolchain['cc']} -dumpfullversion")
    assert reported == toolchain["gcc_version"]
    assert host.check_output(f"{toolchain['cxx']} -dumpfullversion") == reported


def test_compiler_meets_the_release_or_the_degradation_was_accepted(host, toolchain):
    release = release_info(toolchain["vllm_version"])
    found = version_tuple(toolchain["gcc_version"])
    if host.system_info.release.startswith("12"):
        # bookworm's gcc 12.2 is below every release's minimum: the role only
        # accepted it for a release that degrades instead of failing.
        assert found == (12, 2)
        assert release["gcc_by_arch"][host.system_info.arch]["below_min"] == "degrade"
    else:
        assert found >= version_tuple(release["min_gcc"])


def test_compiler_builds_against_libnuma_with_avx512_bf16(host, toolchain):
    source = "/tmp/toolchain_probe.cpp"
    host.run_expect(
        [0],
        "printf '%s\\n' '#include <numa.h>' '#include <immintrin.h>' "
        "'__m512bh cvt(__m512 a, __m512 b) { return _mm512_cvtne2ps_pbh(a, b); }' "
        f"'int main() {{ return numa_available() < -1; }}' > {source}",
    )
    build = host.run(f"{toolchain['cxx']} -O2 -mavx512f -mavx512bf16 {source} -lnuma -o /tmp/toolchain_probe")
    assert build.rc == 0, build.stderr
    assert host.run("/tmp/toolchain_probe").rc == 0


def test_python_headers_and_venv(host):
    include = host.check_output("python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"include\"])'")
    assert host.file(f"{include}/Python.h").exists
    assert host.run("python3 -m venv /tmp/toolchain_venv && /tmp/toolchain_venv/bin/python -c 'pass'").rc == 0


def test_tcmalloc_preloads_from_where_the_fact_says(host, toolchain):
    path = toolchain["tcmalloc_path"]
    assert path.endswith("libtcmalloc_minimal.so.4")
    # What the service's LD_PRELOAD will do: the loader maps it into the process.
    maps = host.run(f"LD_PRELOAD={path} cat /proc/self/maps")
    assert maps.rc == 0
    assert "cannot be preloaded" not in maps.stderr
    assert "libtcmalloc_minimal.so.4" in maps.stdout


@pytest.mark.parametrize("tool", ["git", "ccache", "jq", "lsof", "make", "patch"])
def test_build_tools(host, tool):
    assert host.exists(tool)
