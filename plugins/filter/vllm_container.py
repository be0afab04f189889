"""Thin Jinja2 filters over plugin_utils/vllm_container.py (container mode): roles never recompute a unit,
the seccomp profile or the podman env file; the venv unit takes its systemd policy from the same place."""

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_container import (
    VARIABLES,
    ContainerUnitError,
    container_unit,
    image_id,
    numa_syscalls,
    podman_env_file,
    podman_version,
    seccomp_profile,
    secret_style,
    unit_policy,
    unit_style,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_syntax import Refusal, say


def _fail(name, err):
    return AnsibleFilterError(f"{name} found {len(err.problems)} problem(s):\n" + "\n".join(err.problems))


def vllm_container_unit(plan_instance, serve, knobs):
    """One planned instance's container unit: {style, unit, container, secret_style, podman_args, files}."""
    try:
        return container_unit(plan_instance, serve, knobs)
    except ContainerUnitError as err:
        raise _fail("vllm_container_unit", err) from err


def vllm_container_image_id(value, host=""):
    """An image ID as the units name it (sha256:<64 hex>), from podman image inspect's."""
    pinned = image_id(value)
    if isinstance(pinned, Refusal):
        raise AnsibleFilterError(
            f"vllm_container_image_id found 1 problem(s):\n{say(host, VARIABLES['image_id'], value, pinned)}"
        )
    return pinned


def vllm_container_seccomp(default_profile, vllm_version, host=""):
    """podman's default seccomp profile with exactly the NUMA syscalls vllm_version's binding makes allowed."""
    try:
        return seccomp_profile(default_profile, numa_syscalls(vllm_version), host)
    except ContainerUnitError as err:
        raise _fail("vllm_container_seccomp", err) from err


def vllm_container_env_file(env, header=None, host=""):
    """The text of a podman environment file (NAME=value lines) of env; keys and PATH refused."""
    try:
        return podman_env_file(env, header, host)
    except ContainerUnitError as err:
        raise _fail("vllm_container_env_file", err) from err


def vllm_container_podman(version_text, host=""):
    """What the host's podman (its `podman --version`) decides: {version, style, secret_style}."""
    try:
        found = podman_version(version_text, host)
        return {
            "version": ".".join(map(str, found)),
            "style": unit_style(found, host),
            "secret_style": secret_style(found),
        }
    except ContainerUnitError as err:
        raise _fail("vllm_container_podman", err) from err


def vllm_unit_policy(
    style,
    description,
    firewall_unit=None,
    systemd_version=0,
    systemd_version_text=None,
    stop_timeout=90,
    start_timeout=300,
    memory_high_mib=None,
    memory_max_mib=None,
    address_allow=None,
):
    """The systemd policy lines every style of vllm@<instance>.service shares, as text: {unit, service, memory,
    address} (the venv unit, vllm@.service.j2, writes them where they go)."""
    try:
        policy = unit_policy(
            style,
            description,
            firewall_unit,
            systemd_version,
            systemd_version_text,
            stop_timeout,
            start_timeout,
            memory_high_mib,
            memory_max_mib,
            address_allow,
        )
    except ContainerUnitError as err:
        raise _fail("vllm_unit_policy", err) from err
    return {block: "\n".join(lines) for block, lines in policy.items()}


class FilterModule:
    def filters(self):
        return {
            "vllm_container_unit": vllm_container_unit,
            "vllm_container_image_id": vllm_container_image_id,
            "vllm_container_seccomp": vllm_container_seccomp,
            "vllm_container_env_file": vllm_container_env_file,
            "vllm_container_podman": vllm_container_podman,
            "vllm_unit_policy": vllm_unit_policy,
        }
