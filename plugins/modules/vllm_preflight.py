#!/usr/bin/python
# The action plugin plugins/action/vllm_preflight.py does the work on the controller (it runs
# vllm_cpu_facts on the host); this file holds its documentation, as ansible-doc reads it.

DOCUMENTATION = r"""
---
module: vllm_preflight
short_description: Check a vLLM host before any change, in one module run - facts, plan, every section
description:
  - >-
    Runs C(vllm.cpu_fleet.vllm_cpu_facts) once on the host, asking it at the same time for what the checks must read
    there (the Python that makes the virtualenv, free space, install records, listeners, /dev/shm, capabilities; see its
    C(probe) option), plans the host (the C(vllm_cpu_plan) planner), and runs every check of the sections the host needs
    on the controller (C(plugin_utils/preflight/checks.py)). It fails with every problem at once, each as
    C(<host>: <variable>: <problem>; fix: <fix>).
  - Variables are the roles' effective ones - the inventory's, else the collection's role defaults - typed and checked
    by each role's C(meta/argument_specs.yml) (strings from C(-e) are converted). Nothing on the host changes.
  - The preflight play (C(vllm.cpu_fleet.preflight)) calls it once per host with no O(sections); each role's own
    preflight task file calls it with that role's section, so both use one implementation of each check.
version_added: "2.0.0"
options:
  sections:
    description:
      - The checks to run. V(plan) reads the facts and plans (otherwise the host's C(vllm_plan) fact is used);
        V(toolchain), V(build_host), V(install), V(service), V(rollout) are the roles' checks; V(loadbalancer) only
        types the load balancer role's inputs (its checks are the role's tasks, which need the backends' plans).
      - Unset, the host's groups decide, as the preflight play needs - V(plan) and V(toolchain) for every host,
        V(build_host) for the host that builds (a host of C(builders), or each vLLM host without such a group) when
        C(vllm_install_source) is V(wheel), V(install), V(service) and V(rollout) for hosts of C(vllm_hosts),
        V(loadbalancer) for hosts of C(loadbalancers) (alone, unless the host is also a vLLM host or a builder).
      - V(container) judges a host with C(vllm_service_mode=container) (instead of V(install) - podman, crun, its
        seccomp profile, room for the image, the registry, the model source, what the image is built from) and a host
        that builds the fleet's image while any vLLM host serves from one (podman, Debian, room). Every vLLM host is
        also checked for the knobs only the other mode reads.
      - V(monitoring) types the monitoring role's inputs and checks what Prometheus, Alertmanager and systemd read as
        written (durations, sizes, the webhook URL, ports, thresholds), all of them on the hosts of C(monitoring_group)
        (alone, unless the host is also a vLLM host, a load balancer or a builder), the exporters' ones on every vLLM
        host and load balancer while that group has hosts. Whether the monitoring hosts reach every target is
        C(vllm.cpu_fleet.vllm_reach)'s, after the plans.
    type: list
    elements: str
    choices: [plan, toolchain, build_host, install, service, rollout, container, loadbalancer, monitoring]
  gather_subset:
    description:
      - Subsets of C(setup) the facts module returns in the same run (see C(vllm_cpu_facts)).
      - V(addresses) becomes V(network) where the host's C(vllm_fleet_network_facts) says V(network).
    type: list
    elements: str
    choices: [addresses, network, systemd]
    default: []
  converged:
    description:
      - Also read the host's converged record (C(vllm_fleet_converged_record)) and whether its witnesses hold, in the
        same module run, and return C(vllm_fleet_converged_inputs) - the digest of this host's own inputs, its peers and
        the record - for the preflight play's decision (filter C(vllm.cpu_fleet.vllm_converged_decide)).
    type: bool
    default: false
  fleet:
    description:
      - What the checks read of the fleet's other hosts, as a run with O(fleet_only) returned it (C(fleet)). The
        preflight play reads it once for the run and passes it to every host; unset, a host that needs it reads it
        from C(hostvars) itself (each lookup builds that host's variables; read by every host, that costs the
        square of the fleet).
    type: dict
  fleet_only:
    description:
      - Only read what the checks read of the fleet's other hosts (whether any vLLM host serves from a container)
        and return it as C(fleet), for O(fleet); no check runs. Meant for a C(run_once) task.
    type: bool
    default: false
  collection_plays:
    description:
      - The caller runs the collection's own plays (C(playbooks/preflight.yml) for C(site.yml) and C(upgrade.yml)),
        whose hosts are the groups C(vllm_hosts), C(loadbalancers), C(builders) and C(monitoring) by name. A group
        option (C(loadbalancer_backend_group), C(vllm_service_loadbalancer_group), C(rollout_loadbalancer_group),
        C(vllm_build_builders_group), C(vllm_image_builders_group), C(monitoring_group)) that names another group is
        then refused. A playbook of your own that runs the roles on other groups leaves it off.
    type: bool
    default: false
author:
  - vllm-cpu-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check this host before any change
  vllm.cpu_fleet.vllm_preflight:
    gather_subset: [addresses, systemd]

- name: The install role's own checks and decisions
  vllm.cpu_fleet.vllm_preflight:
    sections: [install]
"""

RETURN = r"""
ansible_facts:
  description: >-
    With V(plan), C(vllm_cpu_facts)'s facts and C(vllm_plan); with each section, the facts its role's later tasks read
    (C(vllm_install_venv), C(vllm_install_needed), C(vllm_install_wanted), ..., C(vllm_build_release));
    with O(converged), C(vllm_fleet_converged_inputs).
  returned: success
  type: dict
fleet:
  description: With O(fleet_only), what the checks read of the fleet's other hosts, for O(fleet).
  returned: success
  type: dict
  contains:
    containers:
      description: Whether any host of C(vllm_hosts) serves from a container (C(vllm_service_mode)).
      type: bool
problems:
  description: Every problem found, one line each (also joined in C(msg)).
  returned: failure
  type: list
  elements: str
"""
