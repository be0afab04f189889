"""A re-run skips a host only when the digest of its inputs is unchanged (module_utils/vllm_converged.py): the
preflight action digests every argument-spec option of the roles the host runs, the plan, the facts' key, the OS
facts, what it derives and the peers' digests. So every variable a role's tasks, handlers, templates and vars read
must be one of those, or made inside the role. A role that starts reading anything else fails here: put it in the
role's argument spec (the digest then has it), or say below how the digest covers it."""

from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm.cpu_fleet.plugins.action.vllm_preflight import DERIVED_INPUTS, SECTION_ROLES, SHARED_ROLE
from jinja2 import Environment, meta

ROLES = Path(__file__).resolve().parents[2] / "roles"
# Keys whose string values Ansible reads as bare expressions, not templates.
BARE = {"when", "that", "changed_when", "failed_when", "until"}

# Read by the roles, in no argument spec, and how the digest covers each.
COVERED = {
    # The digest has the OS facts the roles read (OS_FACTS), the facts' key (hardware, cpuset, limits) and the plan.
    "ansible_facts": "OS_FACTS and vllm_cpu_key",
    "vllm_plan": "the plan",
    # Facts that roles of the same run write and read back: outputs of the digested inputs, witnessed files.
    "ansible_local": "the roles' own local facts (toolchain_witness, vllm_install_witness)",
    "toolchain_facts": "set by the toolchain role in the same run",
    # Preflight's decisions from the host's current state (the run changes that state; the record witnesses it).
    "vllm_install_needed": "the install record, witnessed (vllm_install_witness)",
    "vllm_install_venv": "derived from DERIVED_INPUTS; the install record is witnessed",
    "vllm_install_wheel_path": "vllm_install_wanted (wheel name and sha256)",
    "vllm_install_wheel_sha256": "vllm_install_wanted (wheel name and sha256)",
    "vllm_image_base_day": "vllm_image_inputs (its refresh period is in the base's name)",
    "vllm_install_bundle": "vllm_install_manifest (its inputs key)",
    "vllm_install_wheelhouse_vllm_wheel": "vllm_install_manifest",
    "vllm_build_probe": "what preflight read on the builder",
    "monitoring_prometheus_retention_size_auto": "a monitoring host's watch digest (what preflight derived for it)",
    "vllm_service_model_files": "the controller's model directory (model_files: names, sizes, times)",
    # Other hosts: a vLLM host's load balancers and builders, a load balancer's backends are its peers.
    "hostvars": "the peers' own digests",
    "groups": "the peers (their names are part of the record)",
    "inventory_hostname": "the record is the host's own",
    # Plays set these for the roles they include.
    "vllm_service_serving_from": "set by the rollout from the service role in the same run",
    "vllm_service_snapshot": "set by the rollout in the same run",
    "vllm_service_restore_refused": "set by the service role's restore in the same run (the rollout's rollback)",
    "vllm_service_restore_model_drift": "set by the service role's restore in the same run (the rollout's rollback)",
    "vllm_service_configured_instances": "set by the service role in the same run (the drop-ins it witnesses)",
    "vllm_service_retired": "set by the service role in the same run (configured instances the plan lacks)",
    "loadbalancer_backend_views": "read from the load balancers in the same run",
    "loadbalancer_endpoint_moves": "read from the load balancers in the same run",
    "loadbalancer_capacity_views": "read from the load balancers in the same run (the capacity floor)",
    # Ansible's own.
    **dict.fromkeys(
        [
            "ansible_check_mode",
            "ansible_managed",
            "ansible_play_batch",
            "ansible_play_hosts",
            "ansible_play_hosts_all",
            "ansible_failed_result",
            "ansible_failed_task",
            "ansible_python_interpreter",
            "role_path",
            "lookup",
            "query",
            "now",
            "item",
        ],
        "Ansible's",
    ),
}


class _AnyName(dict):
    """Every filter and test name exists: only the variables matter here."""

    def __contains__(self, name):
        return True

    def get(self, name, default=None):
        return super().get(name, lambda *args, **kwargs: None)


ENV = Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])
ENV.filters, ENV.tests = _AnyName(ENV.filters), _AnyName(ENV.tests)


def _variables(text, bare=False):
    if not isinstance(text, str) or not (bare or "{{" in text or "{%" in text):
        return set()
    return meta.find_undeclared_variables(ENV.parse("{{ " + text + " }}" if bare else text))


def _walk(node, key, read, made):
    if isinstance(node, dict):
        for name, value in node.items():
            if name == "register":
                made.add(value)
            elif name == "loop_control" and isinstance(value, dict):
                made.add(value.get("loop_var", "item"))
            elif (name == "vars" or name.endswith("set_fact")) and isinstance(value, dict):
                made.update(value)
            _walk(value, name, read, made)
    elif isinstance(node, list):
        for value in node:
            _walk(value, key, read, made)
    else:
        read |= _variables(node, bare=key in BARE)


def _options(role):
    specs = yaml.safe_load((ROLES / role / "meta/argument_specs.yml").read_text())["argument_specs"]
    return {name for spec in specs.values() for name in spec.get("options", {})}


def _read_and_made(role):
    read, made = set(), set()
    base = ROLES / role
    for path in (
        sorted(base.glob("tasks/*.yml")) + sorted(base.glob("handlers/*.yml")) + sorted(base.glob("vars/*.yml"))
    ):
        data = yaml.safe_load(path.read_text())
        if path.parent.name == "vars" and isinstance(data, dict):
            made.update(data)
        _walk(data, None, read, made)
    for path in sorted(base.glob("templates/*")):
        read |= _variables(path.read_text())
    return read, made


DIGESTED_ROLES = sorted(set(SECTION_ROLES.values()) | {SHARED_ROLE})


@pytest.mark.parametrize("role", sorted(set(SECTION_ROLES.values()) - {"vllm_plan"}))
def test_every_variable_a_role_reads_is_in_the_converged_digest(role):
    read, made = _read_and_made(role)
    options = set().union(*(_options(name) for name in DIGESTED_ROLES))
    uncovered = sorted(read - made - options - set(COVERED) - set(DERIVED_INPUTS) - {"vllm_release_overrides"})
    assert not uncovered, (
        f"roles/{role} reads {uncovered}, which the converged digest does not hold, so a re-run would skip a host"
        " whose value changed; fix: add each to the role's meta/argument_specs.yml (the digest holds every option), or"
        " say in COVERED how the digest covers it"
    )


def test_every_covered_name_is_read_by_a_role():
    read = set().union(*(_read_and_made(role)[0] for role in SECTION_ROLES.values()))
    assert not sorted(set(COVERED) - read), "COVERED names a variable no role reads; fix: remove it"


def test_the_scan_sees_a_variable_no_spec_has():
    read = set()
    _walk([{"ansible.builtin.debug": {"msg": "{{ undeclared_knob }}"}, "when": "other_knob | bool"}], None, read, set())
    assert {"undeclared_knob", "other_knob"} <= read
