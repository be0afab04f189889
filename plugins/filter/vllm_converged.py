"""Thin Jinja2 filter over the converged record's decision (module_utils/vllm_converged.py)."""

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_converged import decide_fleet


def vllm_converged_decide(hostvars, hosts, builders=None):
    """{host: decision} for the hosts of this run, from each one's vllm_fleet_converged_inputs fact."""
    inputs = {}
    for host in hosts:
        fact = hostvars[host].get("vllm_fleet_converged_inputs")
        if not isinstance(fact, dict) or not {"own", "peers"} <= fact.keys():
            raise AnsibleFilterError(
                f"{host}: vllm_fleet_converged_inputs is not what the preflight action returns "
                f"(got {type(fact).__name__}); fix: run the vllm.cpu_fleet.vllm_preflight action with converged: true "
                "on every host first, in the same run"
            )
        inputs[host] = fact
    return decide_fleet(inputs, [str(builder) for builder in builders or []])


class FilterModule:
    def filters(self):
        return {"vllm_converged_decide": vllm_converged_decide}
