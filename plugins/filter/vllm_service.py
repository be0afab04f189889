"""Thin Jinja2 filter over the vllm_service role's container units (plugin_utils/vllm_container.py makes them)."""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError


def vllm_service_unit_files(units):
    """Each unit file of `units` ({instance: {'files': {path: text}}}, vllm_container_unit's results) once, in
    instance and path order: [{'path', 'text', 'instance'}]; the podman-run template (`.../vllm@.service`, the same
    text for every instance) belongs to no instance ('')."""
    if not isinstance(units, Mapping):
        raise AnsibleFilterError(f"vllm_service_unit_files: expects {{instance: unit}}, got {type(units).__name__}")
    out, seen = [], set()
    for name in sorted(units):
        for path, text in sorted(units[name]["files"].items()):
            if path not in seen:
                seen.add(path)
                out.append({"path": path, "text": text, "instance": "" if path.endswith("/vllm@.service") else name})
    return out


class FilterModule:
    def filters(self):
        return {"vllm_service_unit_files": vllm_service_unit_files}
