"""The unit's ExecStart as roles/vllm_service renders it, through ansible-playbook, per era and distribution.

Fake local hosts plan a recorded 2-socket Sapphire Rapids with the vllm_plan role,
then render the role's instance.conf.j2 with its defaults and vars: the command
comes from the vllm_serve_command filter (the release table decides), every flag
the role sets is there, and systemd-analyze accepts the drop-in. A real vLLM
start on this command is Molecule's (molecule/serve) to prove.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_releases import RELEASES
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
MACHINE = "spr-2s-amx"
MODEL = "/var/lib/vllm/models/tiny-llama"

PLAY = """
- name: Render each instance's command as roles/vllm_service does
  hosts: all
  gather_facts: false
  vars_files:
    - {repo}/roles/vllm_service/vars/main.yml
  tasks:
    - name: Plan
      ansible.builtin.include_role:
        name: vllm.cpu_fleet.vllm_plan
    - name: Render the drop-ins
      ansible.builtin.template:
        src: {repo}/roles/vllm_service/templates/instance.conf.j2
        dest: "{{{{ out }}}}/{{{{ inventory_hostname }}}}-{{{{ instance.name }}}}.conf"
        mode: "0644"
      loop: "{{{{ vllm_plan.instances }}}}"
      loop_control:
        loop_var: instance
      delegate_to: localhost
"""

# host: (release, distribution, more variables)
HOSTS = {
    "early-cpu": ("0.13.0", "vllm-cpu", {}),
    "middle": ("0.20.0", "vllm", {}),
    "current": ("0.32.0", "vllm", {"vllm_service_max_model_len": 512}),
    "current-cpu": ("0.32.0", "vllm-cpu", {
        "vllm_service_api_key_previous": "old-key",
        "vllm_service_extra_args": ["--chat-template", 'say "hi" to $HOME at 100%', "--x", "a b"],
    }),
    "new-from-inventory": ("0.34.0", "vllm", {}),
}  # fmt: skip


def _override_034():
    row = {k: v for k, v in RELEASES["0.33.0"].items() if k != "gcc_workarounds"}
    return {"0.34.0": dict(row, version="0.34.0", git_tag="v0.34.0")}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("service-unit")
    from conftest import expand

    root = expand.expand(MACHINE, tmp / "machines" / MACHINE)
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("vllm", "python"):
        (venv / "bin" / name).write_text("#!/bin/sh\n")
        (venv / "bin" / name).chmod(0o755)
    hosts = {
        name: {
            "vllm_version": version,
            "vllm_service_distribution": dist,
            "vllm_service_active_link": str(venv),
            "vllm_service_model_path": MODEL,
            "vllm_service_listen_address": "10.0.0.5",
            **more,
        }
        for name, (version, dist, more) in HOSTS.items()
    }
    # The role's defaults at the inventory's lowest level, as a role's defaults are: host variables win.
    defaults = yaml.safe_load((REPO / "roles/vllm_service/defaults/main.yml").read_text())
    inventory = {
        "all": {
            "vars": {
                **defaults,
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "vllm_plan_facts_root": str(root),
                "vllm_release_overrides": _override_034(),
                "out": str(tmp / "out"),
            },
            "hosts": hosts,
        }
    }
    (tmp / "out").mkdir()
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "play.yml").write_text(PLAY.format(repo=REPO))
    result = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp / "inventory.yml"), str(tmp / "play.yml")],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORKS": "5"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    return tmp, venv


def _exec_start(path):
    lines = [line for line in path.read_text().splitlines() if line.startswith("ExecStart=")]
    assert lines[0] == "ExecStart=", "the drop-in must reset the template's ExecStart first"
    return lines[-1][len("ExecStart=") :]


def _instances(tmp, host):
    found = sorted((tmp / "out").glob(f"{host}-vllm-*.conf"))
    assert found, host
    return found


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_each_instance_runs_the_releases_entry_point_with_every_flag(rendered, host):
    tmp, venv = rendered
    version, dist, more = HOSTS[host]
    for index, conf in enumerate(_instances(tmp, host)):
        line = _exec_start(conf)
        if dist == "vllm":
            head = f"{venv}/bin/vllm serve {MODEL} "
        else:
            head = f"{venv}/bin/python -m vllm.entrypoints.openai.api_server --model {MODEL} "
        assert line.startswith(head), line
        flags = (f"--served-model-name tiny-llama --host 10.0.0.5 --port {8000 + index} --dtype bfloat16 "
                 "--block-size 128 --middleware vllm_service_auth.RequireApiKey")  # fmt: skip
        assert line[len(head) :].startswith(flags), line
        assert f"(vLLM {version})" in conf.read_text()
        if "vllm_service_max_model_len" in more:
            assert line.endswith("--max-model-len 512")
        if "vllm_service_api_key_previous" in more:
            assert "--config /etc/vllm/api-keys.yaml" in line and "old-key" not in line
            assert line.endswith('--chat-template "say \\"hi\\" to $$HOME at 100%%" --x "a b"'), line


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_every_rendered_command(rendered, tmp_path):
    tmp, _ = rendered
    for conf in sorted((tmp / "out").glob("*.conf")):
        unit = tmp_path / f"{conf.stem}.service"
        unit.write_text(f"[Service]\nType=exec\nExecStart={_exec_start(conf)}\n")
        result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and unit.name not in result.stderr, (conf.name, result.stderr)


def test_the_plan_behind_the_units_is_the_releases(rendered):
    tmp, _ = rendered
    # The 0.34.0 host was planned from its inventory row alone: its drop-in names it.
    text = _instances(tmp, "new-from-inventory")[0].read_text()
    assert "(vLLM 0.34.0)" in text and "/bin/vllm serve " in text
