"""Thin Jinja2 filters over the vLLM CPU planner and release table."""

from pathlib import Path

import ansible.module_utils as _amu
from ansible.errors import AnsibleFilterError

# Controller-side plugins cannot import a collection-less repo's module_utils: put ours on the path.
_MODULE_UTILS = str(Path(__file__).resolve().parents[1] / "module_utils")
if _MODULE_UTILS not in _amu.__path__:
    _amu.__path__.append(_MODULE_UTILS)

from ansible.module_utils.vllm_cpu_planner import PlanError, check, plan  # noqa: E402
from ansible.module_utils.vllm_cpu_releases import (  # noqa: E402
    UnknownReleaseError,
    compiler_verdict,
    release_info,
)


def vllm_cpu_plan(facts, options):
    """The host's serving and build plan; fails listing every problem."""
    try:
        return plan(facts, options)
    except PlanError as err:
        raise AnsibleFilterError(f"vllm_cpu_plan found {len(err.problems)} problem(s):\n{err}") from err


def vllm_cpu_plan_check(facts, options):
    """Every problem with these facts and options, [] when the plan can be made."""
    return check(facts, options)


def vllm_release(version):
    """The release table entry of a vLLM version ("0.32.0" or "v0.32.0")."""
    try:
        return release_info(version)
    except UnknownReleaseError as err:
        raise AnsibleFilterError(str(err)) from err


def vllm_compiler_verdict(gcc_version, vllm_version, isa, arch, accept_degraded=False, host=""):
    """Whether gcc_version builds vllm_version for this host: {ok, severity, min_gcc, missing_isas, message}."""
    try:
        return compiler_verdict(vllm_version, gcc_version, isa, arch, accept_degraded=accept_degraded, host=host)
    except UnknownReleaseError as err:
        raise AnsibleFilterError(str(err)) from err


class FilterModule:
    def filters(self):
        return {
            "vllm_cpu_plan": vllm_cpu_plan,
            "vllm_cpu_plan_check": vllm_cpu_plan_check,
            "vllm_release": vllm_release,
            "vllm_compiler_verdict": vllm_compiler_verdict,
        }
