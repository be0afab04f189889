#!/usr/bin/python

DOCUMENTATION = r"""
---
module: vllm_run_lock
short_description: Take or give back the run lock on a host, so that one run changes it at a time
description:
  - A small JSON file on the host (O(path)) names the run that changes it - its id, owner, controller, ansible-playbook
    process, playbook, start and lease. C(playbooks/run_lock.yml) takes it on every host of a run before any change,
    and on every load balancer the rollout drains on, even one C(--limit) leaves out (with C(delegate_to));
    C(playbooks/run_unlock.yml) gives it back after the run's last play. A run that cannot take every lock gives back
    what it took; a run that stopped later keeps it.
  - The action plugin of the same name computes the run's identity on the controller (the ansible-playbook process, so
    every task of one run has the same id) and decides whether another run's lock may be taken over - only when that
    run's ansible-playbook process has ended on this same controller, or when O(break_lock) names it. An ended lease
    alone proves nothing. When the lock is held by another run, the task does not fail; it returns C(acquired=false)
    and the refusal in C(msg), so a play can give back what it took on other hosts before it stops.
  - The lock is read, decided on and written under an exclusive C(flock); a free lock is an empty file.
  - With C(delegate_to), the lock and the messages are the delegated host's.
  - The logic is C(module_utils/vllm_run_lock.py).
version_added: "2.0.0"
options:
  path:
    description: The lock file (C(vllm_fleet_run_lock)).
    type: path
    required: true
  state:
    description: C(acquire) takes (or renews) the lock; C(release) gives it back when this run holds it.
    type: str
    choices: [acquire, release]
    default: acquire
  lease:
    description: Seconds the lease runs from now (C(vllm_fleet_run_lock_lease)); shown to a run that finds the lock.
    type: int
    default: 21600
  break_lock:
    description: The run id of a lock to take over although its run cannot be proven over (C(vllm_fleet_break_lock)).
    type: str
    default: ""
  holder:
    description: Internal, set by the action plugin - this run's identity.
    type: dict
  replace:
    description: Internal, set by the action plugin - the run id of a lock judged over, replaced only if it still holds.
    type: str
    default: ""
notes:
  - Supports check mode (reports whether the lock could be taken; writes nothing).
  - A run's lock comes and goes within the run, so taking and giving it back report no change; taking over another
    run's lock does.
author:
  - vllm-cpu-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Take the run lock
  vllm.cpu_fleet.vllm_run_lock:
    path: /var/lib/vllm-fleet/run.lock
    break_lock: "{{ vllm_fleet_break_lock | default('') }}"
  register: run_lock
"""

RETURN = r"""
acquired:
  description: Whether this run holds the lock now (C(state=acquire)).
  returned: always
  type: bool
released:
  description: Whether this run gave the lock back (C(state=release)).
  returned: always
  type: bool
holder:
  description: Who holds the lock now (empty when free).
  returned: always
  type: dict
replaced:
  description: The holder of the lock taken over (empty when none was).
  returned: always
  type: dict
msg:
  description: Why the lock was not taken, or whose lock was taken over.
  returned: always
  type: str
run_id:
  description: This run's id.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_run_lock import (  # noqa: E402
    LockError,
    acquire,
    release,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["acquire", "release"], "default": "acquire"},
            "lease": {"type": "int", "default": 21600},
            "break_lock": {"type": "str", "default": ""},
            "holder": {"type": "dict"},
            "replace": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not p["holder"] or not p["holder"].get("run_id"):
        module.fail_json(msg="vllm_run_lock: holder is missing: the action plugin of the same name sets it")
    try:
        if p["state"] == "acquire":
            result = acquire(p["path"], p["holder"], p["replace"], module.check_mode)
            result.setdefault("replaced", {})
            result["released"] = False
        else:
            result = release(p["path"], p["holder"]["run_id"], module.check_mode)
            result.update(acquired=False, replaced={})
    except LockError as err:
        module.fail_json(msg=str(err))
    # The run's own lock comes and goes within the run: the host ends as it began.
    result["changed"] = bool(result.get("replaced"))
    result.update(run_id=p["holder"]["run_id"], msg="")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
