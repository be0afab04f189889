#!/usr/bin/python

DOCUMENTATION = r"""
---
module: vllm_prune
short_description: Remove installed vLLM virtualenvs no rollback needs, never one in use
description:
  - Lists the install directories C(<root>/<version>-<build class>[-r<digest>]) and removes the installs of the
    active version and class that a reinstall superseded and, with O(prune_versions), every version but the active
    one and the newest O(keep_versions) - 1 others, ordered by version number (PEP 440), never by modification time.
  - Every path is compared resolved (realpath), so an install root behind a symlink (C(/opt) on a data disk) is
    handled like any other.
  - Never removes the directory the O(active_link) points at, one whose libraries a running process has loaded
    (each vllm@ instance's virtualenv, read from C(/proc/<pid>/maps)), one a rollout snapshot
    (C(<snapshot dir>/<id>/active)) or rollout record (C(<snapshot dir>/state.json)) names, or one O(protect)
    names. While a vllm@ instance's virtualenv cannot be read (a process just starting), nothing is removed.
  - Nothing is removed without an active link. A directory is renamed away before it is removed, so an interrupted
    run never leaves a half-removed virtualenv under its name; the next run finishes the removal.
  - The decision is C(module_utils/vllm_prune.decide); C(roles/vllm_install/tasks/prune.yml) runs this module.
version_added: "2.0.0"
options:
  root:
    description: The install root (C(vllm_install_root)).
    type: path
    required: true
  active_link:
    description: The link naming the version the host serves (C(vllm_install_active_link)).
    type: path
    required: true
  prune_versions:
    description:
      - Also remove versions beyond O(keep_versions); otherwise only superseded reinstalls of the active version.
    type: bool
    default: false
  keep_versions:
    description: Versions kept with O(prune_versions), the active one included (at least 1).
    type: int
    default: 2
  snapshot_dirs:
    description:
      - Directories holding rollout snapshots and the rollout record (C(rollout_state_dir), the legacy
        C(/var/lib/vllm-rollback)).
    type: list
    elements: path
    default: []
  protect:
    description: More directories never to remove.
    type: list
    elements: path
    default: []
notes:
  - Supports check mode (reports what it would remove).
author:
  - vllm-cpu-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Remove versions beyond the newest two, never one in use
  vllm.cpu_fleet.vllm_prune:
    root: /opt/vllm
    active_link: /opt/vllm/current
    prune_versions: true
    keep_versions: 2
    snapshot_dirs: [/var/lib/vllm-rollout]
"""

RETURN = r"""
removed:
  description: The directories removed (in check mode, that would be removed), resolved, each with its reason.
  returned: always
  type: list
  elements: dict
  sample:
    - {path: /data/opt/vllm/0.32.0-x86_64, reason: an install of the active 0.32.0-x86_64 that a reinstall superseded}
kept:
  description: The other install directories, resolved, each with the reason it stays.
  returned: always
  type: list
  elements: dict
  sample: [{path: /data/opt/vllm/0.32.0-x86_64-r1a2b3c4d, reason: the active version link points here}]
active:
  description: The resolved directory the active link points at, or null (then nothing is removed).
  returned: always
  type: str
protected:
  description: Resolved paths in use, each with who uses it (processes, snapshots, records, O(protect)).
  returned: always
  type: dict
problems:
  description: Why nothing was removed, when a vllm@ instance's virtualenv could not be read.
  returned: always
  type: list
  elements: str
root:
  description: The resolved install root.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_prune import prune  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "active_link": {"type": "path", "required": True},
            "prune_versions": {"type": "bool", "default": False},
            "keep_versions": {"type": "int", "default": 2},
            "snapshot_dirs": {"type": "list", "elements": "path", "default": []},
            "protect": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["keep_versions"] < 1:
        module.fail_json(msg=f"keep_versions (vllm_install_keep_versions) is {p['keep_versions']}; it keeps the active"
                         " version too, so it must be 1 or more.")  # fmt: skip
    result = prune(
        p["root"], p["active_link"], p["keep_versions"], p["prune_versions"], p["snapshot_dirs"], p["protect"],
        module.check_mode,
    )  # fmt: skip
    module.exit_json(**result)


if __name__ == "__main__":
    main()
