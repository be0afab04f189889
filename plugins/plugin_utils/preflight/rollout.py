"""Preflight's rollout section: the batches (rollout_serial)."""

from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_rollout_serial import parse_serial


def rollout(host, v):
    try:
        parse_serial(v["rollout_serial"])
    except ValueError as err:
        return [f"{host}: {err}"]
    return []
