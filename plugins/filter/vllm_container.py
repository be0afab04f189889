"""Thin Jinja2 filters over plugin_utils/vllm_container.py (container mode, issue 30): roles never recompute a unit,
the seccomp profile or the podman env file."""

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


class FilterModule:
    def filters(self):
        return {
            "vllm_container_unit": vllm_container_unit,
            "vllm_container_image_id": vllm_container_image_id,
            "vllm_container_seccomp": vllm_container_seccomp,
            "vllm_container_env_file": vllm_container_env_file,
            "vllm_container_podman": vllm_container_podman,
        }
