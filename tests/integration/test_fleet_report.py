"""playbooks/facts.yml over recorded machines: the real module reads each
machine's tree, the vllm_plan role plans it, and the report lists it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import MACHINE_NAMES, MACHINES, REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def run_facts_playbook(tmp_path, machine_root, version, extra_host_vars=None):
    hosts = {
        name: {"vllm_plan_facts_root": str(machine_root(name)), **(extra_host_vars or {}).get(name, {})}
        for name in MACHINE_NAMES
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": sys.executable,
                        "vllm_version": version,
                    },
                    "children": {"vllm_hosts": {"hosts": hosts}},
                }
            }
        )
    )
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(inventory), "playbooks/facts.yml"],
        cwd=REPO,
        env={**os.environ, "FLEET_REPORT_DIR": str(tmp_path / "report")},
        capture_output=True,
        text=True,
        timeout=600, check=False,
    )


def test_report_has_every_recorded_machine_with_its_plan(tmp_path, machine_root):
    result = run_facts_playbook(tmp_path, machine_root, "0.32.0")
    assert result.returncode == 0, result.stdout[-3000:]
    markdown = (tmp_path / "report" / "fleet-report.md").read_text()
    html = (tmp_path / "report" / "fleet-report.html").read_text()
    rows = {line.split("|")[1].strip(): line for line in markdown.splitlines() if line.startswith("| ")}
    for name in MACHINE_NAMES:
        expected = json.loads((MACHINES / name / "expected_plan.json").read_text())["0.32.0"]
        binds = " ; ".join(instance["omp_threads_bind"] for instance in expected["instances"])
        assert f"`{binds}`" in rows[name], name
        assert expected["isa_class"] in rows[name]
        assert f"MAX_JOBS={expected['build']['max_jobs']}" in rows[name]
        assert f"<td>{name}</td>" in html
        # The live part: a row per planned instance; these hosts have no state reader and nothing listening.
        for instance in expected["instances"]:
            live = next(line for line in markdown.splitlines() if line.startswith(f"| {name} / {instance['name']} |"))
            assert f"| {instance['port']} |" in live and "| state unknown |" in live and "| no answer |" in live
    assert "vllm_fleet_state.py is missing on the host" in markdown
    assert "## By host class" in markdown and '<div class="charts"' in html


def test_bad_knob_stops_the_play_naming_host_variable_and_fix(tmp_path, machine_root):
    result = run_facts_playbook(
        tmp_path,
        machine_root,
        "0.32.0",
        {"spr-2s-amx": {"vllm_plan_omp_threads_bind": ["0-55|56-111", "112-120"]}},
    )
    assert result.returncode != 0
    # A CPU on the same core as one already bound, and SMT siblings in one instance.
    assert "spr-2s-amx: vllm_plan_omp_threads_bind[1]: rank 0 binds CPU 112, on the same physical core" in result.stdout
    assert "fix:" in result.stdout
    assert not (tmp_path / "report" / "fleet-report.md").exists() or "spr-2s-amx" not in (
        tmp_path / "report" / "fleet-report.md"
    ).read_text().split("vllm-0")[0]


def test_unknown_version_names_vllm_version(tmp_path, machine_root):
    result = run_facts_playbook(tmp_path, machine_root, "0.99.0")
    assert result.returncode != 0
    assert "vllm_version: " in result.stdout
    assert "0.32.0" in result.stdout  # the supported versions are listed
