"""A release the table does not know, given only through vllm_release_overrides.

The row is what `tools/vllm_release_probe.py --as-inventory` prints (here for a
stand-in source tree: 0.33.0's table row relabelled 0.34.0, so no download is
needed); ansible-playbook plans a recorded machine with it through the
vllm_plan role and the vllm_release filter, and a bad row stops the run naming
the variable, the version and the key.
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_releases import RELEASES, release_info
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
MACHINE = "spr-2s-amx"

sys.path.insert(0, str(REPO / "tools"))
import vllm_release_probe as cli  # noqa: E402

PLAY = """
- name: Plan with a release from the inventory
  hosts: all
  gather_facts: false
  tasks:
    - name: Plan
      ansible.builtin.include_role:
        name: vllm.cpu_fleet.vllm_plan
    - name: Read the row through the filter
      ansible.builtin.set_fact:
        release_seen: "{{ vllm_version | vllm.cpu_fleet.vllm_release(vllm_release_overrides | default({})) }}"
    - name: Report
      ansible.builtin.copy:
        content: "{{ {'plan': vllm_plan, 'release': release_seen} | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
      delegate_to: localhost
"""


def _row_034():
    row = copy.deepcopy(RELEASES["0.33.0"])
    del row["gcc_workarounds"]
    row.update(version="0.34.0", git_tag="v0.34.0", torch_version="2.15.0")
    return row


def _run(tmp_path, machine_root, overrides_yaml, version="0.34.0"):
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "vllm_release.yml").write_text(overrides_yaml)
    inventory = {
        "all": {
            "hosts": {
                "spr": {
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                    "vllm_version": version,
                    "vllm_plan_facts_root": str(machine_root(MACHINE)),
                    "out": str(tmp_path / "out.json"),
                }
            }
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(PLAY)
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml")],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_NOCOLOR": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_as_inventory_yaml_loads_back_to_the_row():
    row = _row_034()
    loaded = yaml.safe_load(cli.as_inventory(row))
    assert loaded == {"vllm_release_overrides": {"0.34.0": row}}
    assert release_info("0.34.0", loaded["vllm_release_overrides"])["torch_version"] == "2.15.0"


def test_a_release_only_in_the_inventory_is_planned(tmp_path, machine_root):
    result = _run(tmp_path, machine_root, cli.as_inventory(_row_034()))
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads((tmp_path / "out.json").read_text())
    assert seen["plan"]["vllm_version"] == "0.34.0"
    assert seen["plan"]["build"]["build_class"] == "x86_64"
    assert seen["release"]["torch_version"] == "2.15.0"
    assert seen["release"]["gcc_workarounds"] == {}


def test_a_bad_row_names_the_variable_version_and_key(tmp_path, machine_root):
    row = _row_034()
    row["min_gcc"] = "twelve"
    result = _run(tmp_path, machine_root, cli.as_inventory(row))
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "vllm_release_overrides['0.34.0'].min_gcc" in out, out
    assert "tools/vllm_release_probe.py 0.34.0 --as-inventory" in out


def test_an_unknown_release_names_the_probe(tmp_path, machine_root):
    result = _run(tmp_path, machine_root, "---\n{}\n", version="0.35.0")
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "vllm_version" in out and "tools/vllm_release_probe.py 0.35.0 --as-inventory" in out, out
