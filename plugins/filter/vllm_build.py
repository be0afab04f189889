"""Filters of the vllm_build role: who builds which class, and artifact naming."""

import hashlib
import json

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_wheel import select_wheels, wheel_pattern

MANIFEST_FORMAT = 1


def vllm_build_assignments(host_classes, builders=None, host_arches=None):
    """Map each build class to the one host that builds it.

    host_classes: {host: build class} of every host in the play (in play order);
    builders: hosts of the builders group in the play; host_arches: {host: arch}.
    A builder of the same class wins, then a builder of the same architecture
    (it builds with the class's ISA variables), then the class's first host.
    Returns {build class: {"builder": host, "source": "builders"|"class"}}.
    """
    builders = [host for host in (builders or []) if host in host_classes]
    arches = host_arches or {}
    result = {}
    for host, wheel_class in host_classes.items():
        if not wheel_class:
            raise AnsibleFilterError(f"{host}: vllm_plan.build.build_class is empty; run the vllm_plan role first")
        if wheel_class in result:
            continue
        same_class = [b for b in builders if host_classes[b] == wheel_class]
        same_arch = [b for b in builders if arches.get(b) and arches.get(b) == arches.get(host)]
        if same_class:
            result[wheel_class] = {"builder": same_class[0], "source": "builders"}
        elif same_arch:
            result[wheel_class] = {"builder": same_arch[0], "source": "builders"}
        else:
            result[wheel_class] = {"builder": host, "source": "class"}
    return result


def vllm_build_classes_of(assignments, host):
    """The build classes ``host`` builds (sorted), from vllm_build_assignments."""
    return sorted(name for name, item in assignments.items() if item["builder"] == host)


def vllm_build_manifest_name(version):
    """File name of the JSON manifest next to the wheel: vllm-<version>.json."""
    return f"vllm-{version}.json"


def vllm_build_wheel_pattern(version):
    """Regex a built wheel's file name matches: vllm-<version>[+local]-<tags>.whl."""
    try:
        return wheel_pattern(version)
    except ValueError as err:
        raise AnsibleFilterError(str(err)) from err


def vllm_build_select_wheels(paths, version):
    """The paths whose file name is a wheel of vLLM ``version`` (vllm_build_wheel_pattern)."""
    try:
        return select_wheels(paths, version)
    except ValueError as err:
        raise AnsibleFilterError(str(err)) from err


def vllm_build_inputs_key(inputs):
    """Stable 16-hex key of what decides a wheel's content: a change rebuilds."""
    text = json.dumps({"format": MANIFEST_FORMAT, "inputs": inputs}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def vllm_build_manifest_ok(manifest, inputs_key, wheel_sha256=None):
    """Whether a manifest read from the artifact dir still describes the wanted wheel."""
    if not isinstance(manifest, dict):
        return False
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("inputs_key") != inputs_key:
        return False
    try:
        if not select_wheels([str(manifest.get("wheel", ""))], manifest.get("version", "")):
            return False
    except ValueError:  # no valid version: the manifest describes no wheel
        return False
    return wheel_sha256 is None or manifest.get("sha256") == wheel_sha256


class FilterModule:
    def filters(self):
        return {
            "vllm_build_assignments": vllm_build_assignments,
            "vllm_build_classes_of": vllm_build_classes_of,
            "vllm_build_manifest_name": vllm_build_manifest_name,
            "vllm_build_wheel_pattern": vllm_build_wheel_pattern,
            "vllm_build_select_wheels": vllm_build_select_wheels,
            "vllm_build_inputs_key": vllm_build_inputs_key,
            "vllm_build_manifest_ok": vllm_build_manifest_ok,
        }
