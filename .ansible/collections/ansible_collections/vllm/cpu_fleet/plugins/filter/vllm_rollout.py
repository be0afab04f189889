"""Thin Jinja2 filters over the rollout's batch sizes (module_utils/vllm_rollout_serial.py)."""

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_rollout_serial import (
    SerialError,
    batch_sizes,
    parse_serial,
)


def vllm_rollout_serial(value, host=None):
    """rollout_serial as the play's serial list (None: the default); fails naming host, variable and fix."""
    try:
        return parse_serial(value)
    except SerialError as err:
        raise AnsibleFilterError(f"{host}: {err}" if host else str(err)) from err


def vllm_rollout_batches(value, hosts):
    """The rollout play's batches with this rollout_serial: sizes for a number of hosts, host lists for a list."""
    if isinstance(hosts, (list, tuple)):
        sizes, batches = batch_sizes(vllm_rollout_serial(value), len(hosts)), []
        for size in sizes:
            start = sum(len(batch) for batch in batches)
            batches.append(list(hosts[start : start + size]))
        return batches
    return batch_sizes(vllm_rollout_serial(value), int(hosts))


class FilterModule:
    def filters(self):
        return {"vllm_rollout_serial": vllm_rollout_serial, "vllm_rollout_batches": vllm_rollout_batches}
