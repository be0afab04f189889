"""Thin Jinja2 filter over the load balancer's backend guard (module_utils/vllm_lb_backends.py)."""

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_lb_backends import BackendError, removal_check


def vllm_lb_removal_check(config_text, backend, planned, max_removed_percent, group="vllm_hosts", host=None):
    """The servers this run would remove from the configured backend, and the problem if they are too many."""
    try:
        result = removal_check(config_text, backend, planned, max_removed_percent, group)
    except BackendError as err:
        raise AnsibleFilterError(f"{host}: {err}" if host else str(err)) from err
    if result["problem"] and host:
        result["problem"] = f"{host}: {result['problem']}"
    return result


class FilterModule:
    def filters(self):
        return {"vllm_lb_removal_check": vllm_lb_removal_check}
