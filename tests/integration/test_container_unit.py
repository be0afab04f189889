"""The container mode's units and environment as roles/vllm_service renders them (vllm_service_mode: container,
issue 30), through ansible-playbook: the role's own vars (vllm_service_container_command, _knobs, _runtime_env) into
the filters, on a recorded 2-socket Sapphire Rapids planned by the vllm_plan role.

The same plan as the venv mode: the command's arguments after the model are the venv unit's, word for word; the
CPUs and NUMA nodes are the plan's; the key is a podman secret (never in a file); the model, the key middleware and
the TLS files are mounted read-only. A real start is molecule/container's to prove.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
MACHINE = "spr-2s-amx"
MODEL_DIR = "/var/lib/vllm/models/tiny-llama"
IMAGE = "localhost/vllm-cpu-fleet/vllm:0.32.0-x86_64-amx-0123456789abcdef"
IMAGE_ID = "ab" * 32
KEY = "fleet-key-15e26068dea123b6"
PREVIOUS = "old-key-0123456789abcdef"

PLAY = """
- name: Render each instance's container unit as roles/vllm_service does
  hosts: all
  gather_facts: false
  vars_files:
    - {repo}/roles/vllm_service/vars/main.yml
  tasks:
    - name: Plan
      ansible.builtin.include_role:
        name: vllm.cpu_fleet.vllm_plan
    - name: What units_container.yml reads on the host
      ansible.builtin.set_fact:
        vllm_service_podman_facts: >-
          {{{{ podman_version_text | vllm.cpu_fleet.vllm_container_podman(inventory_hostname) }}}}
        vllm_service_account: {{uid: "998", gid: "997"}}
        vllm_service_container_image_id: "{image_id}"
    - name: Render the unit, the environment and both modes' commands
      ansible.builtin.copy:
        dest: "{{{{ out }}}}/{{{{ inventory_hostname }}}}-{{{{ instance.name }}}}.json"
        content: >-
          {{{{ {{'unit': instance | vllm.cpu_fleet.vllm_container_unit(vllm_service_container_command,
                                                                        vllm_service_container_knobs),
               'env': instance.env | combine(vllm_service_container_runtime_env, vllm_service_extra_env)
                      | vllm.cpu_fleet.vllm_container_env_file('header', inventory_hostname),
               'container_argv': vllm_service_container_command.argv,
               'venv_argv': vllm_service_command.argv,
               'instance': instance}} | to_json }}}}
        mode: "0644"
      loop: "{{{{ vllm_plan.instances }}}}"
      loop_control:
        loop_var: instance
      delegate_to: localhost
"""

# host: (podman --version, more variables)
HOSTS = {
    "quadlet": ("podman version 5.4.2", {
        "vllm_service_api_key_previous": PREVIOUS,
        "vllm_service_tls_certificate": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----",
        "vllm_service_extra_args": ["--chat-template", 'say "hi" to $HOME at 100%'],
    }),
    "podman-run": ("podman version 4.3.1", {
        "vllm_service_api_key": "", "vllm_service_allow_unauthenticated": True, "vllm_service_firewall": "none",
    }),
    "built": ("podman version 5.4.2", {"vllm_install_source": "wheel", "vllm_service_max_model_len": 512}),
}  # fmt: skip


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("container-unit")
    from conftest import expand

    root = expand.expand(MACHINE, tmp / "machines" / MACHINE)
    hosts = {
        name: {
            "podman_version_text": version,
            "vllm_version": "0.32.0",
            "vllm_service_mode": "container",
            "vllm_service_distribution": "vllm-cpu",
            "vllm_service_active_link": "/opt/vllm/current",
            "vllm_service_model_path": "/controller/models/tiny-llama",
            "vllm_service_served_model_name": "tiny-llama",
            "vllm_service_listen_address": "10.0.0.5",
            "vllm_service_api_key": KEY,
            "vllm_image_reference": IMAGE,
            **more,
        }
        for name, (version, more) in HOSTS.items()
    }
    # The roles' defaults at the inventory's lowest level, as a role's defaults are: host variables win.
    defaults = {}
    for role in ("vllm_fleet", "vllm_service"):
        defaults.update(yaml.safe_load((REPO / f"roles/{role}/defaults/main.yml").read_text()))
    inventory = {
        "all": {
            "vars": {
                **defaults,
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "vllm_plan_facts_root": str(root),
                "out": str(tmp / "out"),
            },
            "hosts": hosts,
        }
    }
    (tmp / "out").mkdir()
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "play.yml").write_text(PLAY.format(repo=REPO, image_id=IMAGE_ID))
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
    return {path.stem: json.loads(path.read_text()) for path in sorted((tmp / "out").glob("*.json"))}


def _of(rendered, host):
    found = {name.split("-", 1)[1] if not name.startswith("podman-run") else name[len("podman-run-") :]: item
             for name, item in rendered.items() if name.startswith(host + "-vllm-")}  # fmt: skip
    assert found, host
    return found


def _entries(text):
    entries, section = [], None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _sep, value = line.partition("=")
        entries.append((section, key, value))
    return entries


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_the_container_serves_the_venv_modes_command_from_the_image(rendered, host):
    for item in _of(rendered, host).values():
        container, venv = item["container_argv"], item["venv_argv"]
        assert container[0].startswith("/opt/vllm/venv/bin/")
        # The same arguments, word for word: the plan, the middleware, TLS, the extra arguments.
        if host == "built":
            assert container[:3] == ["/opt/vllm/venv/bin/vllm", "serve", MODEL_DIR]
            assert container[3:] == venv[-len(container[3:]) :]
            assert container[-2:] == ["--max-model-len", "512"]
        else:
            assert container[1:] == venv[1:]
            assert container[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
        assert "--middleware" in container and "vllm_service_auth.RequireApiKey" in container
        assert not [word for word in container if KEY in word or PREVIOUS in word]


def test_quadlet_files_carry_the_plan_the_image_and_the_mounts(rendered):
    for name, item in _of(rendered, "quadlet").items():
        unit, instance = item["unit"], item["instance"]
        assert unit["style"] == "quadlet" and unit["unit"] == f"vllm@{name}.service"
        ((path, text),) = unit["files"].items()
        assert path == f"/etc/containers/systemd/vllm@{name}.container"
        entries = _entries(text)
        container = [(key, value) for section, key, value in entries if section == "Container"]
        assert ("Image", f"sha256:{IMAGE_ID}") in container and IMAGE in text  # the name in a comment
        assert ("EnvironmentFile", f"/etc/vllm/{name}.env") in container
        assert ("SeccompProfile", "/etc/vllm/seccomp.json") in container
        assert ("AddCapability", "SYS_NICE") in container and ("DropCapability", "ALL") in container
        assert ("User", "998") in container and ("Group", "997") in container
        volumes = [value for key, value in container if key == "Volume"]
        assert volumes == [
            "/var/lib/vllm:/var/lib/vllm:rw",
            f"{MODEL_DIR}:{MODEL_DIR}:ro",
            "/usr/local/lib/vllm-service:/usr/local/lib/vllm-service:ro",
            "/etc/vllm/tls.crt:/etc/vllm/tls.crt:ro",
            "/etc/vllm/tls.key:/etc/vllm/tls.key:ro",
        ]
        secrets = [value for key, value in container if key == "Secret"]
        assert secrets == [
            "vllm-service-api-key,type=env,target=VLLM_SERVICE_API_KEY",
            "vllm-service-previous-api-key,type=env,target=VLLM_SERVICE_PREVIOUS_API_KEY",
        ]
        (podman_args,) = [value for key, value in container if key == "PodmanArgs"]
        nodes = ",".join(map(str, instance["numa_nodes"]))
        assert podman_args == f"--cpuset-cpus={instance['cpus']} --cpuset-mems={nodes}"
        service = dict((key, value) for section, key, value in entries if section == "Service")
        assert service["MemoryMax"].endswith("M") and service["Restart"] == "always"
        assert ("Unit", "Requires", "vllm-firewall.service") in entries
        assert KEY not in text and PREVIOUS not in text
        # systemd's quoting of the extra argument, through Quadlet's Exec= as written.
        (exec_line,) = [value for key, value in container if key == "Exec"]
        assert exec_line.endswith('--chat-template "say \\"hi\\" to $$HOME at 100%%"'), exec_line


def test_the_environment_has_the_images_paths_and_no_key(rendered):
    for name, item in _of(rendered, "quadlet").items():
        env = dict(line.split("=", 1) for line in item["env"].splitlines() if not line.startswith("#"))
        assert env["PYTHONPATH"] == "/usr/local/lib/vllm-service"
        assert env["USER"] == env["LOGNAME"] == "vllm"
        assert env["HOME"] == "/var/lib/vllm"
        preload = env["LD_PRELOAD"].split(":")
        assert preload[0] == "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", name
        assert "/opt/vllm/venv/lib/libiomp5.so" in preload
        for variable, value in item["instance"]["env"].items():
            assert env[variable] == str(value)
        assert not [key for key in env if "API_KEY" in key] and "PATH" not in env
        assert KEY not in item["env"] and "VLLM_SERVICE_ALLOW_UNAUTHENTICATED" not in env


def test_podman_4_3_gets_the_podman_run_unit_and_serving_without_a_key_says_so(rendered):
    for name, item in _of(rendered, "podman-run").items():
        unit = item["unit"]
        assert unit["style"] == "podman-run"
        assert sorted(unit["files"]) == [
            "/etc/systemd/system/vllm@.service",
            f"/etc/systemd/system/vllm@{name}.service.d/instance.conf",
        ]
        assert "Secret" not in json.dumps(unit) and "--secret" not in " ".join(unit["podman_args"])
        assert "Requires=vllm-firewall.service" not in unit["files"]["/etc/systemd/system/vllm@.service"]
        assert "VLLM_SERVICE_ALLOW_UNAUTHENTICATED=1" in item["env"].splitlines()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_podman_run_units(rendered, tmp_path):
    for name, item in _of(rendered, "podman-run").items():
        files = item["unit"]["files"]
        dropin = files[f"/etc/systemd/system/vllm@{name}.service.d/instance.conf"]
        (exec_start,) = [line for line in dropin.splitlines() if line.startswith("ExecStart=") and len(line) > 10]
        unit = tmp_path / f"{name}.service"
        unit.write_text(f"[Service]\nType=notify\nNotifyAccess=all\n{exec_start}\n")
        result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False)
        assert result.returncode == 0 and unit.name not in result.stderr, result.stderr
