"""Thin Jinja2 filters over the converged record (module_utils/vllm_converged.py): the decision, the inputs' digest,
the digest of a controller tree (a model)."""

import os

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_converged import decide_fleet, digest, tree_signature


def _plain(value):
    """A copy in plain dicts and lists, which refers to nothing Ansible made."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _inputs(hostvars, host):
    """The host's vllm_fleet_converged_inputs, copied. hostvars[host] builds the host's whole variable set and what
    it returns refers to that set (the play's host lists among it): keeping it would keep every host's set until the
    last one is read, memory growing faster than the fleet (+9.5 MiB at 300 hosts, +65 MiB at 1,000); the copy
    lets each go at once."""
    fact = hostvars[host].get("vllm_fleet_converged_inputs")
    if not isinstance(fact, dict) or not {"own", "peers"} <= fact.keys():
        raise AnsibleFilterError(
            f"{host}: vllm_fleet_converged_inputs is not what the preflight action returns "
            f"(got {type(fact).__name__}); fix: run the vllm.cpu_fleet.vllm_preflight action with converged: true "
            "on every host first, in the same run"
        )
    return _plain(fact)


def vllm_converged_decide(hostvars, hosts, builders=None):
    """{host: decision} for the hosts of this run, from each one's vllm_fleet_converged_inputs fact."""
    inputs = {host: _inputs(hostvars, host) for host in hosts}
    return decide_fleet(inputs, [str(builder) for builder in builders or []])


def vllm_converged_digest(inputs):
    """The sha256 of a record's inputs ({own, peers}): what the monitoring host compares with the host's record."""
    if not isinstance(inputs, dict) or not {"own", "peers"} <= inputs.keys():
        raise AnsibleFilterError(
            f"vllm_converged_digest: expects a decision's inputs ({{own, peers}}), got {type(inputs).__name__};"
            " fix: pass hostvars[host].vllm_fleet_converged.inputs from this run's preflight"
        )
    return digest(_plain(inputs))


def vllm_converged_tree_digest(path):
    """The digest of a controller directory's files (names, sizes, times): preflight's vllm_service_model_files."""
    if not isinstance(path, str) or not os.path.isdir(path):
        raise AnsibleFilterError(
            f"vllm_converged_tree_digest: {path!r} is not a directory on the controller; "
            "fix: set vllm_service_model_path to the model's directory"
        )
    return digest(tree_signature(path))


class FilterModule:
    def filters(self):
        return {
            "vllm_converged_decide": vllm_converged_decide,
            "vllm_converged_digest": vllm_converged_digest,
            "vllm_converged_tree_digest": vllm_converged_tree_digest,
        }
