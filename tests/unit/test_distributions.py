"""Every (release, distribution, architecture): can the distribution's compiler build the release?

The distributions are roles/toolchain/vars/<distribution>-<major>.yml (the compiler each installs,
toolchain_gcc_distribution_version); the releases and their minimum gcc per architecture are the
release table's. Toolchain preflight asks compiler_verdict the same question with the host's own
file and stops before any change; this pins down which combinations it refuses and what it says.
"""

import pytest
import yaml
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import (
    RELEASES,
    _version_tuple,
    compiler_verdict,
)
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

VARS = sorted(p for p in (REPO / "roles/toolchain/vars").glob("*-*.yml"))
COMPILERS = {p.stem: yaml.safe_load(p.read_text())["toolchain_gcc_distribution_version"] for p in VARS}
# The richest host of each architecture: everything a degrading build could drop, it has.
ISA = {
    "x86_64": {"avx2": True, "avx512f": True, "avx512_bf16": True, "avx512_vnni": True, "amx_bf16": True},
    "aarch64": {"asimd": True, "bf16": True, "i8mm": True},
}
COMBINATIONS = [(v, d, a) for v in sorted(RELEASES, key=_version_tuple) for d in COMPILERS for a in ISA]


def _key(version):
    return tuple(int(part) for part in version.split("."))


def _refused(accept_degraded=False, accept_workaround=False):
    refused = {}
    for version, distribution, arch in COMBINATIONS:
        verdict = compiler_verdict(version, COMPILERS[distribution], ISA[arch], arch, accept_degraded, "h",
                                   None, accept_workaround, distribution, COMPILERS)  # fmt: skip
        if not verdict["ok"]:
            refused[(version, distribution, arch)] = verdict
    return refused


def test_every_distribution_file_names_a_compiler():
    assert set(COMPILERS) == {"Debian-12", "Debian-13", "RedHat-9", "Ubuntu-22", "Ubuntu-24"}
    for name, gcc in COMPILERS.items():
        assert _version_tuple(gcc) >= (11, 0, 0), name


def test_only_debian_12_on_x86_falls_short_and_only_where_the_table_says():
    # Debian 12's gcc 12.2 is below every release's 12.3; the others ship 12.3 or later. No release checks gcc on Arm.
    refused = _refused()
    assert set(refused) == {(v, "Debian-12", "x86_64") for v in RELEASES}
    assert {v for (v, _unused, _unused), verdict in refused.items() if verdict["severity"] == "degraded"} == {
        v for v in RELEASES if _key(v) < (0, 17, 0)
    }
    # Accepting the slower build leaves the fatal era; the gcc 12.2 patches take 0.31.0-0.33.0 out of it.
    fatal_era = {(v, "Debian-12", "x86_64") for v in RELEASES if _key(v) >= (0, 17, 0)}
    assert set(_refused(accept_degraded=True)) == fatal_era
    assert set(_refused(accept_degraded=True, accept_workaround=True)) == {
        (v, "Debian-12", "x86_64") for v in RELEASES if (0, 17, 0) <= _key(v) < (0, 31, 0)
    }


@pytest.mark.parametrize(("version", "distribution", "arch"), sorted(_refused()))
def test_a_refusal_names_host_variable_distribution_and_the_distributions_that_can(version, distribution, arch):
    message = _refused()[(version, distribution, arch)]["message"]
    minimum = RELEASES[version]["min_gcc"]
    assert message.startswith(f"h: vllm_version: vLLM {version} needs gcc >= {minimum} on {arch} (")
    found = f"and {distribution} installs gcc {COMPILERS[distribution]} (roles/toolchain/vars/{distribution}.yml)"
    assert found in message
    problem, fix = message.split("; fix: ")
    able = [name for name, gcc in COMPILERS.items() if _version_tuple(gcc) >= _version_tuple(minimum)]
    assert able and all(f"{name} (gcc {COMPILERS[name]})" in fix for name in able)
    assert distribution not in fix
    assert ("vllm_build_gcc122_workaround: true" in fix) == bool(RELEASES[version]["gcc_workarounds"])
    assert ("toolchain_accept_degraded_isa: true" in fix) == ("silently drops" in problem)


def test_no_supported_distribution_meeting_the_minimum_is_said_plainly():
    overrides = {"0.34.0": dict(RELEASES["0.33.0"], version="0.34.0", git_tag="v0.34.0", min_gcc="15.1")}
    verdict = compiler_verdict("0.34.0", COMPILERS["Debian-13"], ISA["x86_64"], "x86_64", host="h",
                               overrides=overrides, distribution="Debian-13", compilers=COMPILERS)  # fmt: skip
    assert not verdict["ok"]
    assert "fix: add a roles/toolchain/vars file for a distribution whose gcc meets it" in verdict["message"]


def test_without_a_distribution_the_message_is_the_compiler_found():
    # The check after the install (and vllm_build's) judges the gcc actually installed.
    verdict = compiler_verdict("0.32.0", "12.2.0", ISA["x86_64"], "x86_64", host="h")
    assert verdict["message"].startswith("h: vLLM 0.32.0 needs gcc >= 12.3 but gcc 12.2.0 was found")
