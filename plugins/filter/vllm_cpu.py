"""Thin Jinja2 filters over the vLLM CPU planner and release table."""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import PlanError, check, plan
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import (
    InvalidReleaseRowError,
    UnknownReleaseError,
    compiler_verdict,
    release_info,
    release_overrides,
    torch_pin,
    wheel_libraries,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_serve import serve_command, systemd_exec_start


def _split(options, overrides):
    """The planner's options without release_overrides, and the overrides (argument or options key)."""
    if options is not None and not isinstance(options, Mapping):
        return options, overrides or {}  # the planner refuses it with a message
    options = dict(options or {})
    from_options = options.pop("release_overrides", None)
    return options, (overrides if overrides is not None else from_options) or {}


def _host(options):
    return (options.get("host") if isinstance(options, Mapping) else None) or "host"


def vllm_cpu_plan(facts, options, overrides=None):
    """The host's serving and build plan; fails listing every problem, so one call both checks and plans.

    ``overrides`` (or ``options.release_overrides``) is the inventory's vllm_release_overrides.
    """
    options, overrides = _split(options, overrides)
    try:
        with release_overrides(overrides):
            return plan(facts, options)
    except (PlanError, InvalidReleaseRowError) as err:
        problems = err.problems if isinstance(err, PlanError) else [f"{_host(options)}: {p}" for p in err.problems]
        raise AnsibleFilterError(f"vllm_cpu_plan found {len(problems)} problem(s):\n" + "\n".join(problems)) from err


def vllm_cpu_plan_check(facts, options, overrides=None):
    """Every problem with these facts and options, [] when the plan can be made."""
    options, overrides = _split(options, overrides)
    try:
        with release_overrides(overrides):
            return check(facts, options)
    except InvalidReleaseRowError as err:
        return [f"{_host(options)}: {problem}" for problem in err.problems]


def vllm_release(version, overrides=None):
    """The release table entry of a vLLM version ("0.32.0" or "v0.32.0"), overrides merged over the table."""
    try:
        return release_info(version, overrides or {})
    except (UnknownReleaseError, InvalidReleaseRowError) as err:
        raise AnsibleFilterError(str(err)) from err


def _flag(value):
    """An inventory boolean ("yes", "true", 1) as a bool; anything else is left for the verdict to name."""
    try:
        return boolean(value, strict=True)
    except TypeError:
        return value


def vllm_compiler_verdict(
    gcc_version,
    vllm_version,
    isa,
    arch,
    accept_degraded=False,
    host="",
    overrides=None,
    accept_workaround=False,
    distribution="",
    compilers=None,
):
    """Whether gcc_version builds vllm_version here: {ok, severity, min_gcc, missing_isas, patches, message}."""
    try:
        return compiler_verdict(
            vllm_version,
            gcc_version,
            isa,
            arch,
            accept_degraded=_flag(accept_degraded),
            host=host,
            overrides=overrides or {},
            accept_workaround=_flag(accept_workaround),
            distribution=distribution or None,
            compilers=compilers or {},
        )
    except ValueError as err:  # an unknown release, a bad override row, bad facts
        raise AnsibleFilterError(str(err)) from err


def vllm_torch_pin(vllm_version, arch, overrides=None):
    """The torch version vllm_version pins on arch, with +cpu on x86_64 ("2.13.0+cpu")."""
    try:
        return torch_pin(vllm_version, arch, overrides or {})
    except ValueError as err:  # an unknown release, a bad override row, a bad arch
        raise AnsibleFilterError(str(err)) from err


def vllm_wheel_libraries(vllm_version, arch, overrides=None):
    """The compiled vllm/_C* modules a CPU wheel of vllm_version built on arch holds."""
    try:
        return wheel_libraries(vllm_version, arch, overrides or {})
    except ValueError as err:  # an unknown release, a bad override row, a bad arch
        raise AnsibleFilterError(str(err)) from err


def vllm_serve_command(vllm_version, distribution, venv, model, args=None, overrides=None, host=""):
    """How an instance of vllm_version serves: {argv, exec_start} (exec_start quoted for a unit's ExecStart=)."""
    try:
        argv = serve_command(vllm_version, distribution, venv, model, [] if args is None else args, overrides or {})
        return {"argv": argv, "exec_start": systemd_exec_start(argv)}
    except ValueError as err:  # an unknown release, a bad override row, a bad input
        raise AnsibleFilterError(f"{host}: {err}" if host else str(err)) from err


class FilterModule:
    def filters(self):
        return {
            "vllm_cpu_plan": vllm_cpu_plan,
            "vllm_cpu_plan_check": vllm_cpu_plan_check,
            "vllm_release": vllm_release,
            "vllm_compiler_verdict": vllm_compiler_verdict,
            "vllm_torch_pin": vllm_torch_pin,
            "vllm_wheel_libraries": vllm_wheel_libraries,
            "vllm_serve_command": vllm_serve_command,
        }
