"""Thin Jinja2 filters over the rollout's order and batch sizes (plugin_utils/vllm_rollout_serial.py)."""

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_rollout_serial import (
    SerialError,
    batch_sizes,
    canary_order,
    play_serial,
)


def vllm_rollout_serial(value, host=None, canaries=None):
    """rollout_serial as the play's serial list (None: the canary batches, then 10%); fails naming host and fix."""
    try:
        return play_serial(value, canaries)
    except SerialError as err:
        raise AnsibleFilterError(f"{host}: {err}" if host else str(err)) from err


def vllm_rollout_batches(value, hosts, canaries=None):
    """The rollout play's batches with this rollout_serial: sizes for a number of hosts, host lists for a list."""
    if isinstance(hosts, (list, tuple)):
        sizes, batches = batch_sizes(vllm_rollout_serial(value, canaries=canaries), len(hosts)), []
        for size in sizes:
            start = sum(len(batch) for batch in batches)
            batches.append(list(hosts[start : start + size]))
        return batches
    return batch_sizes(vllm_rollout_serial(value, canaries=canaries), int(hosts))


def vllm_rollout_order(hosts, keys):
    """The rollout play's hosts with one host of each key (build class, service mode) first, and the canary batches."""
    if not isinstance(keys, Mapping):
        raise AnsibleFilterError(f"vllm_rollout_order: keys must map hosts to their keys, got {type(keys).__name__}")
    order, canaries = canary_order(list(hosts), keys)
    return {"hosts": order, "canaries": canaries}


def vllm_rollout_hosts_where(hosts, hostvars, name):
    """The hosts of `hosts` whose variable `name` is true (Ansible's booleans: 'yes', 'true', 1...); a host without
    it is left out."""
    return [host for host in hosts if boolean(hostvars[host].get(name, False), strict=False)]


class FilterModule:
    def filters(self):
        return {
            "vllm_rollout_serial": vllm_rollout_serial,
            "vllm_rollout_batches": vllm_rollout_batches,
            "vllm_rollout_order": vllm_rollout_order,
            "vllm_rollout_hosts_where": vllm_rollout_hosts_where,
        }
