#!/usr/bin/python

DOCUMENTATION = r"""
---
module: vllm_converged
short_description: Write or remove the record of what a host converged to
description:
  - The converged record (C(module_utils/vllm_converged.py)) lets a re-run skip a host whose inputs and state are
    unchanged; the preflight play reads it and checks its witnesses (through C(vllm_cpu_facts)' C(probe)).
  - V(present) writes the record - O(inputs) and the witnesses O(witness) names as they are now (the sha256 of
    every file under O(witness.files), the names and sizes under O(witness.trees), the targets of
    O(witness.links), the units O(witness.units) that must stay active and enabled, the users and groups
    O(witness.users), O(witness.groups) by their numbers, the live nftables tables O(witness.nft_tables) by the
    digest of their rules). The file is mode 0600,
    replaced atomically, and unchanged (V(changed=false)) when it would hold the same.
  - V(absent) removes it; site.yml and upgrade.yml do so before they change a host, so a run lost half way
    leaves no record.
version_added: "2.0.0"
options:
  path:
    description: The record file.
    type: path
    required: true
  state:
    description: Whether the record exists afterwards.
    type: str
    choices: [present, absent]
    default: present
  inputs:
    description:
      - What the host converged to - C(own), the digest of its own inputs, and C(peers), its peers' own digests - as
        the preflight gate decided them (C(vllm_fleet_converged.inputs)). Required with V(present).
    type: dict
  witness:
    description: What to record of the host's state. Required with V(present).
    type: dict
    suboptions:
      files:
        description: Files, or directories whose every file is hashed.
        type: list
        elements: path
        default: []
      trees:
        description: Directories recorded by their files' names and sizes only (a model's weights).
        type: list
        elements: path
        default: []
      links:
        description: Symbolic links recorded by their targets.
        type: list
        elements: path
        default: []
      units:
        description: systemd units that must be active and enabled.
        type: list
        elements: str
        default: []
      users:
        description: Users recorded by their uid, gid and home (the users the units run as).
        type: list
        elements: str
        default: []
      groups:
        description: Groups recorded by their gid.
        type: list
        elements: str
        default: []
      nft_tables:
        description:
          - nftables tables, as C(<family> <name>), recorded by the digest of their live rules (C(nft -j list table),
            without handles and counters' values); a table flushed or edited by hand is drift even while the unit that
            loaded it is active.
        type: list
        elements: str
        default: []
notes:
  - Supports check mode (reports what would change, writes nothing).
author:
  - vllm-cpu-fleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Record what this host converged to
  vllm.cpu_fleet.vllm_converged:
    path: /var/lib/vllm-fleet/converged.json
    inputs: "{{ vllm_fleet_converged.inputs }}"
    witness:
      files: [/etc/vllm, /etc/systemd/system/vllm@.service]
      links: [/opt/vllm/current]
      units: [vllm@node0.service]

- name: Forget it before changing the host
  vllm.cpu_fleet.vllm_converged:
    path: /var/lib/vllm-fleet/converged.json
    state: absent
"""

RETURN = r"""
witness:
  description: The witnesses as recorded (with V(present)).
  returned: when state is present
  type: dict
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_converged import write_record  # noqa: E402


def main():
    list_of_paths = {"type": "list", "elements": "path", "default": []}
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "inputs": {"type": "dict"},
            "witness": {
                "type": "dict",
                "options": {
                    "files": list_of_paths,
                    "trees": list_of_paths,
                    "links": list_of_paths,
                    "units": {"type": "list", "elements": "str", "default": []},
                    "users": {"type": "list", "elements": "str", "default": []},
                    "groups": {"type": "list", "elements": "str", "default": []},
                    "nft_tables": {"type": "list", "elements": "str", "default": []},
                },
            },
        },
        required_if=[("state", "present", ("inputs", "witness"))],
        supports_check_mode=True,
    )
    path, params = module.params["path"], module.params
    if params["state"] == "absent":
        exists = os.path.lexists(path)
        if exists and not module.check_mode:
            os.unlink(path)
        module.exit_json(changed=exists)
    try:
        changed, recorded = write_record(path, params["inputs"], params["witness"], check=module.check_mode)
    except OSError as exc:
        module.fail_json(msg=f"cannot write the converged record {path}: {exc}")
    module.exit_json(changed=changed, witness=recorded)


if __name__ == "__main__":
    main()
