"""roles/vllm_service's configure in container mode, in check mode, as the rollout runs it before it decides whether
a host needs a drained restart (include_role tasks_from configure, apply check_mode) - on the controller, against
a temporary root, with a stand-in podman. Check mode writes nothing (and this test never runs the role otherwise:
it would create the service account on the controller); it proves that every task and expression of the container
path evaluates, that a new host restarts every instance and names the image as what it serves from, and that the
converged record's witnesses are Quadlet's files, without the version link.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
MACHINE = "spr-2s-amx"
IMAGE = "localhost/vllm-cpu-fleet/vllm:0.32.0-x86_64-amx-0123456789abcdef"
IMAGE_ID = "5e" * 32
FAKE_PODMAN = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/podman.log"
case "$1" in
  --version) echo "podman version 5.4.2" ;;
  image) [ "$2" = inspect ] && [ "$5" = "{image}" ] && echo "{image_id}" ;;
  *) exit 2 ;;
esac
"""


def test_configure_in_check_mode_plans_the_container_units(tmp_path):
    from conftest import expand

    root = expand.expand(MACHINE, tmp_path / "machines" / MACHINE)
    model = tmp_path / "controller-model" / "tiny-llama"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    podman = tmp_path / "bin" / "podman"
    podman.parent.mkdir()
    podman.write_text(FAKE_PODMAN.format(image=IMAGE, image_id=IMAGE_ID))
    podman.chmod(0o755)
    out = tmp_path / "result.json"
    role_vars = {
        "vllm_service_mode": "container",
        "vllm_image_reference": IMAGE,
        "vllm_service_user": "nobody",
        "vllm_service_group": "nogroup",
        "vllm_service_home": str(tmp_path / "home"),
        "vllm_service_config_dir": str(tmp_path / "etc-vllm"),
        "vllm_service_python_dir": str(tmp_path / "python"),
        "vllm_service_systemd_dir": str(tmp_path / "systemd"),
        "vllm_service_quadlet_dir": str(tmp_path / "quadlet"),
        "vllm_service_podman": str(podman),
        "vllm_service_podman_seccomp_default": str(
            REPO / "tests/fixtures/container/seccomp-containers-common-v0.62.3.json"
        ),
        "vllm_service_model_path": str(model),
        "vllm_service_served_model_name": "tiny-llama",
        "vllm_service_listen_address": "127.0.0.1",
        "vllm_service_firewall": "none",
        "vllm_service_api_key": "check-mode-key-15e26068dea123b6",
        "vllm_service_api_key_previous": "old-key-0123456789abcdef",
    }
    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {
            "ansible_python_interpreter": sys.executable,
            "vllm_version": "0.32.0",
            "vllm_plan_facts_root": str(root),
        },
        "tasks": [
            {"name": "Plan", "ansible.builtin.include_role": {"name": "vllm.cpu_fleet.vllm_plan"}},
            {
                "name": "Configure as the rollout's check-mode pass does",
                "ansible.builtin.include_role": {
                    "name": "vllm.cpu_fleet.vllm_service",
                    "tasks_from": "configure",
                    "apply": {"check_mode": True},
                },
                "vars": role_vars,
            },
            {
                "name": "Keep what it decided",
                "ansible.builtin.copy": {
                    "dest": str(out),
                    "content": (
                        "{{ {'restart': vllm_service_restart_instances, 'from': vllm_service_serving_from,"
                        " 'witness': vllm_service_witness, 'style': vllm_service_podman_facts.style,"
                        " 'files': vllm_service_container_files | map(attribute='path') | list,"
                        " 'texts': vllm_service_container_files | map(attribute='text') | list,"
                        " 'planned': vllm_plan.instances | map(attribute='name') | list} | to_json }}"
                    ),
                    "mode": "0644",
                },
                "check_mode": False,
            },
        ],
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    result = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")],
        cwd=REPO,
        env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_STDOUT_CALLBACK="default"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    found = json.loads(out.read_text())
    # A new host: every planned instance restarts, and it serves from the image.
    assert sorted(found["restart"]) == sorted(found["planned"]) and found["planned"]
    assert found["from"] == IMAGE and found["style"] == "quadlet"
    quadlet = [str(tmp_path / "quadlet" / f"vllm@{name}.container") for name in found["planned"]]
    assert sorted(found["files"]) == sorted(quadlet)
    # The units run the image by the ID its name has on the host.
    assert all(f"\nImage=sha256:{IMAGE_ID}\n" in text for text in found["texts"]), found["texts"][0]
    # No version link in container mode; the served model's link (a version of the controller's model) is witnessed.
    assert found["witness"]["links"] == [str(tmp_path / "home" / "models" / "tiny-llama")]
    assert set(quadlet) <= set(found["witness"]["files"])
    assert not [path for path in found["witness"]["files"] if ".service.d" in path or path.endswith("vllm@.service")]
    # Check mode wrote nothing: no unit, no env file, no secret.
    assert not (tmp_path / "quadlet").exists() and not (tmp_path / "etc-vllm").exists()
    log = (tmp_path / "bin" / "podman.log").read_text()
    assert "secret" not in log and "--version" in log
    # The keys never reach the output.
    assert "check-mode-key" not in result.stdout + result.stderr
