"""For every release in the table and every recorded machine, the plan sets only the
VLLM_CPU_* variables that release reads, with values that release accepts.

The release's own parsing (vllm/envs.py; the table's env_vars hold type and default)
decides what "accepts" means: an int variable gets a positive integer (0 KV cache
GiB is a zero-sized cache), a bool one "0" or "1", and VLLM_CPU_OMP_THREADS_BIND
one cpulist per rank separated by "|" (0.20+ asserts the count equals the ranks).
"""

import re

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import plan
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES
from ansible_collections.vllm.cpu_fleet.tests.conftest import MACHINE_NAMES, MACHINES, load_expected_facts

# Machines with a hand-checked plan (the corrupt trees have none).
PLANNED = [name for name in MACHINE_NAMES if (MACHINES / name / "expected_plan.json").exists()]
CPULIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def _accepts(spec, name, value, tp):
    if spec["type"] == "int":
        return value.isdigit() and int(value) >= 1
    if spec["type"] == "bool":
        return value in ("0", "1")
    if name == "VLLM_CPU_OMP_THREADS_BIND":
        ranks = value.split("|")
        return value in ("auto", "nobind") or (len(ranks) == tp and all(CPULIST.match(r) for r in ranks))
    return isinstance(value, str)


@pytest.mark.parametrize("name", PLANNED)
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_plan_uses_only_what_the_release_reads(version, name):
    release = RELEASES[version]
    result = plan(load_expected_facts(name), {"vllm_version": version, "host": name})
    assert result["vllm_version"] == version
    for instance in result["instances"]:
        for variable, value in instance["env"].items():
            if not variable.startswith("VLLM_CPU_"):
                continue
            assert variable in release["env_vars"], f"{version} does not read {variable}"
            spec = release["env_vars"][variable]
            assert _accepts(spec, variable, value, instance["tp"]), f"{version}: {variable}={value!r} ({spec})"
        # libiomp5 is the unit's to preload only where vLLM does not (no release does).
        assert instance["ld_preload_needed"]["iomp"] == (result["arch"] == "x86_64" and not release["preloads_iomp"])
    build_vars = {k for env in release["build_isa_env"].values() for k in env}
    for variable in result["build"]["env"]:
        if variable.startswith("VLLM_CPU_"):
            assert variable in build_vars, f"{version}'s cpu_extension.cmake does not read {variable}"
    if release["universal_x86_wheel"] and result["arch"] == "x86_64":
        assert result["build"]["build_class"] == "x86_64"


def test_every_release_and_machine_is_covered():
    assert len(PLANNED) >= 10 and len(RELEASES) == 31
