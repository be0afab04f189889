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
import re
import subprocess
import sys
from pathlib import Path

import yaml
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES, release_info
from conftest import REPO
from test_preflight import controller_inputs, failure_of, recap, run_preflight  # noqa: F401  # pylint: disable=unused-import

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
    assert "vllm.cpu_fleet.release_probe -e vllm_release_probe_version=0.34.0" in out


def test_an_unknown_release_names_the_probe(tmp_path, machine_root):
    result = _run(tmp_path, machine_root, "---\n{}\n", version="0.35.0")
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "vllm_version" in out and "vllm.cpu_fleet.release_probe -e vllm_release_probe_version=0.35.0" in out, out


# ----------------------------------------------------------------- through preflight (what upgrade.yml runs first)

# Filters that read the release table; each takes the inventory's overrides.
RELEASE_FILTERS = ("vllm_release", "vllm_compiler_verdict", "vllm_torch_pin", "vllm_wheel_libraries",
                   "vllm_cpu_plan_check", "vllm_serve_command")  # fmt: skip


def test_upgrade_yml_runs_preflight_first():
    plays = yaml.safe_load((REPO / "playbooks" / "upgrade.yml").read_text())
    first = {"name": "Preflight with the new version", "ansible.builtin.import_playbook": "vllm.cpu_fleet.preflight"}
    assert plays[0] == first


def test_a_release_only_in_the_inventory_passes_preflight(tmp_path, machine_root, controller_inputs):  # noqa: F811
    row = _row_034()
    # Debian 12's gcc 12.2 (this controller) builds it only with the patches the operator lists for it,
    # an optional key of an override row; without them the same run stops (the cross-check below).
    patched = dict(row, gcc_workarounds=RELEASES["0.33.0"]["gcc_workarounds"])
    hosts = {
        "new-release": {"vllm_version": "0.34.0", "vllm_release_overrides": {"0.34.0": patched}},
        "new-release-unpatched": {"vllm_version": "0.34.0", "vllm_release_overrides": {"0.34.0": row}},
        "bad-row": {
            "vllm_version": "0.34.0",
            "vllm_release_overrides": {"0.34.0": dict(row, torch_plus_cpu_arches="x86_64")},
        },
        "unknown": {"vllm_version": "0.35.0", "vllm_release_overrides": {"0.34.0": patched}},
        # build.sh writes each build variable as `export NAME=...`: a line break in a name ran a command.
        "bad-env-name": {
            "vllm_version": "0.34.0",
            "vllm_release_overrides": {
                "0.34.0": dict(patched, build_isa_env=dict(row["build_isa_env"], x86_64={"X\ntouch /tmp/p\nY": "1"}))
            },
        },
    }
    result = run_preflight(tmp_path, machine_root, controller_inputs, hosts)
    output = result.stdout
    assert result.returncode != 0
    # The gate names the hosts that failed their own checks (it reports on one host of the run).
    failed = re.search(r"Preflight failed on (.+?) \(their messages", output).group(1).split(", ")
    assert sorted(failed) == ["bad-env-name", "bad-row", "new-release-unpatched", "unknown"], failed
    assert all(stats["changed"] == 0 for stats in recap(output).values())
    unpatched = failure_of(output, "new-release-unpatched")
    assert "vLLM 0.34.0 needs gcc >= 12.3" in unpatched and "fix:" in unpatched, unpatched
    bad = failure_of(output, "bad-row")
    assert "vllm_release_overrides['0.34.0'].torch_plus_cpu_arches" in bad, bad
    assert "vllm.cpu_fleet.release_probe -e vllm_release_probe_version=0.34.0" in bad
    bad_env = failure_of(output, "bad-env-name")
    assert "vllm_release_overrides['0.34.0'].build_isa_env: " in bad_env, bad_env
    assert "x86_64: 'X\\ntouch /tmp/p\\nY' is not a variable name VLLM_CPU_*" in bad_env, bad_env
    unknown = failure_of(output, "unknown")
    assert "unknown: vllm_version: vLLM version '0.35.0' is not supported" in unknown, unknown
    assert "supported versions: 0.13.0" in unknown and "0.34.0" in unknown
    assert "vllm.cpu_fleet.release_probe -e vllm_release_probe_version=0.35.0" in unknown


def _calls(text, name):
    """The argument text of every `| name(...)` in ``text`` (to the matching parenthesis)."""
    found = []
    for match in re.finditer(r"\|\s*(?:vllm\.cpu_fleet\.)?" + name + r"\(", text):
        depth, end = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        found.append(text[match.end() : end - 1])
    return found


def test_roles_and_playbooks_read_the_table_only_through_the_overrides():
    sources = [*REPO.glob("roles/**/*.yml"), *REPO.glob("roles/**/*.j2"), *REPO.glob("playbooks/*.yml")]
    sources.append(REPO / "site.yml")
    seen = 0
    for path in sources:
        text = path.read_text()
        for name in RELEASE_FILTERS:
            for arguments in _calls(text, name):
                seen += 1
                assert "vllm_release_overrides" in arguments, f"{path.relative_to(REPO)}: {name}({arguments})"
        # The planner takes them inside its options (roles/vllm_plan/vars/main.yml's release_overrides).
        for arguments in _calls(text, "vllm_cpu_plan"):
            seen += 1
            assert "vllm_release_overrides" in arguments or arguments.strip() == "vllm_plan_options", path
    # Preflight's checks read the table in Python (plugin_utils/preflight/checks.py, tests/unit/test_preflight.py).
    assert seen >= 9
    plan_vars = (REPO / "roles/vllm_plan/vars/main.yml").read_text()
    assert 'release_overrides: "{{ vllm_release_overrides | default({}) }}"' in plan_vars
    # Nothing but the table module opens its rows.
    for path in [*REPO.glob("plugins/**/*.py"), *REPO.glob("roles/**/*.py"), *REPO.glob("scripts/*")]:
        if path.name in ("vllm_cpu_releases.py",) or not path.is_file():
            continue
        text = path.read_text()
        assert "vllm_cpu_releases.json" not in text and "RELEASES" not in text, path


def test_an_override_that_changes_a_known_release_is_said_once(tmp_path, machine_root, controller_inputs):  # noqa: F811
    """Issue 44: a row replacing a built-in one with other values passed without a word. Said once per run (the
    preflight play's run_once fleet task), not once per host."""
    known = {k: v for k, v in RELEASES["0.32.0"].items() if k not in ("prebuilt", "gcc_workarounds", "wheel_only")}
    overrides = {"0.32.0": dict(known, torch_version="2.99.0")}
    hosts = {name: {"vllm_release_overrides": overrides} for name in ("known-1", "known-2", "known-3")}
    result = run_preflight(tmp_path, machine_root, controller_inputs, hosts)
    output = result.stdout + result.stderr  # Ansible's warnings go to stderr
    said = "vllm_release_overrides: 0.32.0 replaces the table's row of a release it knows and changes torch_version"
    assert re.sub(r"\s+", " ", output).count(said) == 1, output
