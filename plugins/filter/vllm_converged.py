"""Thin Jinja2 filter over the converged record's decision (module_utils/vllm_converged.py)."""

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_converged import decide


def vllm_converged_decide(converged_inputs, peers_own, host=None):
    """The preflight gate's decision for one host from its vllm_fleet_converged_inputs and its peers' own digests."""
    try:
        return decide(
            converged_inputs["own"],
            {peer: peers_own.get(peer) for peer in converged_inputs["peers"]},
            converged_inputs.get("recorded"),
            bool(converged_inputs.get("full_converge")),
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise AnsibleFilterError(
            f"{host or 'host'}: vllm_fleet_converged_inputs is not what the preflight action returns ({err}); "
            "fix: run playbooks/preflight.yml in the same run, before this decision"
        ) from err


class FilterModule:
    def filters(self):
        return {"vllm_converged_decide": vllm_converged_decide}
