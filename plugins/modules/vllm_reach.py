#!/usr/bin/python

DOCUMENTATION = r"""
---
module: vllm_reach
short_description: Check that this host reaches every target address and port (the monitoring host's preflight)
description:
  - Opens a TCP connection from the host to every O(targets) address and port, all at once, each waiting at most
    O(timeout) seconds, and closes it again; nothing is sent and nothing on the host changes.
  - >-
    A connection that is made or refused is fine - the target's host answered (nothing listens there yet on a new
    fleet, or its firewall resets the connection until this run admits the monitoring host). A connection that
    times out, a target without a route (no route to host, network unreachable) and a name that does not resolve
    are problems; the module fails with every one of them at once, each as
    C(<source>: monitoring: cannot reach <target> (<address>) port <port> from the monitoring host (<why>); fix: ...).
  - The monitoring role's C(tasks_from=preflight) calls it on each monitoring host after the preflight play, with every
    planned vLLM instance, every node exporter and every load balancer's HAProxy exporter it will scrape.
version_added: "2.0.0"
options:
  targets:
    description: The targets to connect to.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The target's name in the messages (its inventory name).
        type: str
        required: true
      address:
        description: Address or host name to connect to.
        type: str
        required: true
      port:
        description: TCP port to connect to.
        type: int
        required: true
  timeout:
    description: Seconds each connection may take before its target counts as unreachable.
    type: float
    default: 2.0
  source:
    description: This host's inventory name, which the messages name.
    type: str
    required: true
notes:
  - Supports check mode (it changes nothing in either mode).
author:
  - vllm-cpu-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check that this monitoring host reaches every target's port
  vllm.cpu_fleet.vllm_reach:
    source: "{{ inventory_hostname }}"
    targets:
      - {name: serve-vllm-1, address: 10.0.0.5, port: 8000}
      - {name: serve-vllm-1, address: 10.0.0.5, port: 9100}
    timeout: 2
"""

RETURN = r"""
reach:
  description: Every target as given, with C(state) (V(connected), V(refused) or V(unreachable)) and C(reason).
  returned: always
  type: list
  elements: dict
  sample: [{name: serve-vllm-1, address: 10.0.0.5, port: 8000, state: refused, reason: connection refused}]
problems:
  description: One line per target this host cannot reach (also joined in C(msg)).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_reach import problems, reach  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "targets": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "name": {"type": "str", "required": True},
                    "address": {"type": "str", "required": True},
                    "port": {"type": "int", "required": True},
                },
            },
            "timeout": {"type": "float", "default": 2.0},
            "source": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    results = reach(module.params["targets"], module.params["timeout"])
    found = problems(module.params["source"], results)
    if found:
        module.fail_json(msg="\n".join(found), reach=results, problems=found)
    module.exit_json(changed=False, reach=results, problems=[])


if __name__ == "__main__":
    main()
