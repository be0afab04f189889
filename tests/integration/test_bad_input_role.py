"""Role vllm_plan through ansible-playbook with values given as an operator gives them
(issue 13): -e makes every number a string, which the role must plan with; bad values
stop the play before any later task, naming host, variable and fix.

The hosts are the controller (local connection) reading a recorded machine tree through
vllm_plan_facts_root; nothing on the controller changes but the plan files the test reads.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import expand
import pytest
import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
# JSON results: one line per message (the yaml callback format would wrap them).
ENV = dict(os.environ, ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")


def run(tmp_path, hosts, *extra):
    """Run vllm_plan on ``hosts`` ({name: vars}); return (rc, output, {host: plan})."""
    out = tmp_path / "plans"
    out.mkdir(exist_ok=True)
    common = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vllm_version": "0.32.0",
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"vars": common, "hosts": hosts}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        textwrap.dedent(
            f"""\
            - hosts: all
              gather_facts: false
              roles:
                - vllm.cpu_fleet.vllm_plan
              tasks:
                - name: Keep the plan for the test
                  ansible.builtin.copy:
                    content: "{{{{ vllm_plan | to_json }}}}"
                    dest: "{out}/{{{{ inventory_hostname }}}}.json"
                    mode: "0644"
            """
        )
    )
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(inventory), str(playbook), *extra],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )
    plans = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return proc.returncode, proc.stdout + proc.stderr, plans


@pytest.fixture(scope="module")
def spr(tmp_path_factory):
    return str(expand.expand("spr-2s-amx", tmp_path_factory.mktemp("spr") / "tree"))


def test_numbers_from_the_command_line_plan(tmp_path, spr):
    rc, output, plans = run(
        tmp_path,
        {"spr": {"vllm_plan_facts_root": spr}},
        "-e", "vllm_plan_tp=2", "-e", "vllm_plan_max_jobs=4", "-e", "vllm_plan_kvcache_gib=2",
        "-e", "vllm_plan_model_size_gib=30", "-e", "vllm_plan_base_port=9100",
    )  # fmt: skip
    assert rc == 0, output
    (instance,) = plans["spr"]["instances"]
    assert (instance["tp"], instance["kvcache_gib"], instance["port"]) == (2, 2, 9100)
    assert plans["spr"]["build"]["env"]["MAX_JOBS"] == "4"


def test_a_word_for_a_number_is_refused_naming_the_variable(tmp_path, spr):
    rc, output, plans = run(tmp_path, {"spr": {"vllm_plan_facts_root": spr}}, "-e", "vllm_plan_tp=abc")
    assert rc != 0 and not plans
    # Ansible's argument spec speaks first: it names the variable and stops before any task.
    assert "vllm_plan_tp" in output and "'abc'" in output, output
    assert "Traceback" not in output


def test_a_boolean_for_a_number_is_refused_in_the_projects_words(tmp_path, spr):
    # Ansible's int check lets True through; the planner does not.
    rc, output, plans = run(tmp_path, {"spr": {"vllm_plan_facts_root": spr}}, "-e", '{"vllm_plan_tp": true}')
    assert rc != 0 and not plans
    assert "spr: vllm_plan_tp: True is a boolean, not a whole number; fix: " in output, output


def test_each_bad_value_stops_its_host_with_host_variable_and_fix(tmp_path, spr):
    broken_tree = str(expand.expand("corrupt-numa-missing-2s", tmp_path / "broken"))
    hosts = {
        "model": ({"vllm_plan_model_size_gib": "-1000"}, "model: vllm_plan_model_size_gib: '-1000' is too small"),
        "kv": ({"vllm_plan_kvcache_gib": "-5"}, "kv: vllm_plan_kvcache_gib: '-5' is too small"),
        "port": ({"vllm_plan_base_port": "70000"}, "port: vllm_plan_base_port: '70000' is too large"),
        "dtype": ({"vllm_plan_dtype": "garbage"}, "dtype: vllm_plan_dtype: 'garbage' is not a dtype"),
        "jobs": ({"vllm_plan_build_gib_per_job": "0"}, "jobs: vllm_plan_build_gib_per_job: '0' is too small"),
        "nan": ({"vllm_plan_memory_fraction": "nan"}, "nan: vllm_plan_memory_fraction: 'nan' is not a number"),
        "bind": ({"vllm_plan_omp_threads_bind": []}, "bind: vllm_plan_omp_threads_bind: is an empty list"),
        "huge": ({"vllm_plan_omp_threads_bind": ["0-99999"]}, "huge: vllm_plan_omp_threads_bind[0]: rank 0: invalid"),
        "numa": ({"vllm_plan_facts_root": broken_tree}, "sys/devices/system/node: missing on a machine with 2 sockets"),
    }
    inventory = {name: dict({"vllm_plan_facts_root": spr}, **values) for name, (values, _unused) in hosts.items()}
    rc, output, plans = run(tmp_path, inventory)
    assert rc != 0
    assert not plans, "no host got a plan"
    for name, (_unused, message) in hosts.items():
        assert message in output, f"{name}: {message!r} not in\n{output}"
    assert "Traceback" not in output and "MODULE FAILURE" not in output
    huge = next(line for line in output.splitlines() if "huge: vllm_plan_omp_threads_bind" in line)
    assert len(huge) < 400


def test_numa_single_and_a_cpu_quota(tmp_path):
    broken_tree = expand.expand("corrupt-numa-missing-2s", tmp_path / "broken")
    quota_tree = expand.expand("milan-container-cpuset", tmp_path / "milan")
    (quota_tree / "sys/fs/cgroup/cpu.max").write_text("200000 100000\n")
    hosts = {
        "single": {"vllm_plan_facts_root": str(broken_tree), "vllm_plan_numa": "single"},
        "quota": {"vllm_plan_facts_root": str(quota_tree)},
    }
    rc, output, plans = run(tmp_path, hosts)
    assert rc == 0, output
    (instance,) = plans["single"]["instances"]
    assert instance["numa_nodes"] == [0]
    (instance,) = plans["quota"]["instances"]
    assert instance["omp_threads_bind"].isdigit(), "2 CPUs of quota: one OpenMP thread and the reserved core"
    assert plans["quota"]["build"]["max_jobs"] <= 2
