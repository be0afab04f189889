"""Preflight's toolchain section: the distribution's package list and compiler against the release and this CPU."""

from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.common import _overrides
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import compiler_verdict


def toolchain(host, v, facts, distribution_file, distribution_vars, compilers):
    """The distribution's package list and compiler against the release and this CPU.

    distribution_file: the roles/toolchain/vars file stem for this host ("Debian-12"), "" when none;
    distribution_vars: that file's variables; compilers: {file stem: gcc version} of every supported one.
    Returns problems, warnings (a degraded build said loudly), facts.
    """
    if not v.get("toolchain_vllm_version"):
        return (
            [f"{host}: toolchain_vllm_version is not set; set vllm_version in the inventory (group_vars/all)."],
            [],
            {},
        )
    if "toolchain_gcc_packages" not in distribution_vars:
        return (
            [
                f"{host}: {facts.get('distribution')} {facts.get('distribution_version')} is not supported by the"
                " toolchain role (supported: Debian 12/13, Ubuntu 22.04/24.04, EL 9). Add roles/toolchain/vars/"
                f"{facts.get('distribution')}-{facts.get('distribution_major_version')}.yml."
            ],
            [],
            {},
        )
    if not v["toolchain_install_compiler"]:
        return [], [], {}
    cpu = facts["vllm_cpu"]
    try:
        verdict = compiler_verdict(
            v["toolchain_vllm_version"],
            distribution_vars["toolchain_gcc_distribution_version"],
            cpu["isa"],
            cpu["arch"],
            accept_degraded=v["toolchain_accept_degraded_isa"],
            host=None,
            overrides=_overrides(v),
            accept_workaround=v["toolchain_accept_gcc_below_minimum"],
            distribution=distribution_file or None,
            compilers=compilers,
        )
    except ValueError as err:
        return [f"{host}: {err}"], [], {}
    if not verdict["ok"]:
        return [f"{host}: {verdict['message']}"], [], {"toolchain_preflight_verdict": verdict}
    # A degraded or patched build is the same on every host of the distribution (and ISAs): said without the host,
    # Ansible shows it once per run, not once per host of a large fleet.
    where = f"{distribution_file} hosts" if distribution_file else "hosts of this distribution"
    warnings = [f"{where}: {verdict['message']}"] if verdict["severity"] != "ok" else []
    return [], warnings, {"toolchain_preflight_verdict": verdict}
