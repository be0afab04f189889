"""Thin Jinja2 filters over plugin_utils/vllm_image.py: the fleet's own vLLM image (what it is built from, its name)
and which of a host's images, and of the archives on the controller and the builders, may go."""

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_image import (
    image_plan,
    prune_decision,
    repository,
    store_prune_decision,
)


def _protected(value):
    """{name: why}, from a mapping or a list of names (each kept because a host of this run runs it or is given it)."""
    if isinstance(value, (list, tuple)):
        return dict.fromkeys(value, "a host of this run runs it or is given it")
    return dict(value or {})


def vllm_image_plan(version, build_class, arch, options, host=""):
    """What the image of (version, build class) is built from and named; fails naming every problem."""
    try:
        plan, problems = image_plan(version, build_class, arch, dict(options or {}), host)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AnsibleFilterError(f"vllm_image_plan: {host or 'host'}: {err}") from err
    if problems:
        raise AnsibleFilterError(f"vllm_image_plan found {len(problems)} problem(s):\n" + "\n".join(problems))
    return plan


def vllm_image_prune(images, registry, protected, keep):
    """Which images of the fleet's repository on registry a host may remove: {remove, keep}."""
    try:
        return prune_decision(images, repository(registry), _protected(protected), int(keep))
    except (ValueError, TypeError) as err:
        raise AnsibleFilterError(f"vllm_image_prune: {err}") from err


def vllm_image_store_prune(files, protected_tags, keep):
    """Which image archives and manifests (the controller's store, a builder's work root) may go: {remove, keep}."""
    try:
        return store_prune_decision(list(files or []), _protected(protected_tags), int(keep))
    except (ValueError, TypeError) as err:
        raise AnsibleFilterError(f"vllm_image_store_prune: {err}") from err


class FilterModule:
    def filters(self):
        return {
            "vllm_image_plan": vllm_image_plan,
            "vllm_image_prune": vllm_image_prune,
            "vllm_image_store_prune": vllm_image_store_prune,
        }
