"""roles/vllm_service tasks_from model_path through ansible-playbook, on the controller (local connection), into a
temporary home: the copy of a controller model runs only when the controller's model (its digest from preflight,
vllm_service_model_files) or the host's copy changed since the last copy's stamp.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from ansible_collections.vllm.cpu_fleet.plugins.module_utils import vllm_converged
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
ENV = dict(
    os.environ,
    ANSIBLE_NOCOLOR="1",
    ANSIBLE_FORCE_COLOR="0",
    ANSIBLE_RETRY_FILES_ENABLED="0",
    ANSIBLE_STDOUT_CALLBACK="default",
    ANSIBLE_CALLBACK_RESULT_FORMAT="json",
)


def run(tmp_path, with_digest=True, check=False):
    """One run of model_path.yml; returns (rc, output, the copy task's result)."""
    source = tmp_path / "controller" / "tiny"
    variables = {
        "vllm_service_model_source": "path",
        "vllm_service_model_path": str(source),
        "vllm_service_home": str(tmp_path / "home"),
        "vllm_service_config_dir": str(tmp_path / "etc"),
        "vllm_service_user": "root",
        "vllm_service_group": "root",
    }
    if with_digest:  # what preflight gives the host
        variables["vllm_service_model_files"] = vllm_converged.digest(vllm_converged.tree_signature(str(source)))
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"vllmhost": host}}}
    role = {"name": "vllm.cpu_fleet.vllm_service", "tasks_from": "model_path"}
    play = [{"hosts": "all", "gather_facts": False, "tasks": [
        {"name": "model_path", "ansible.builtin.include_role": role},
        {"name": "Say what the copy did", "ansible.builtin.debug": {"msg": "COPY={{ vllm_service_model | to_json }}"}},
    ]}]  # fmt: skip
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(variables))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    argv = [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), "-e", f"@{tmp_path / 'vars.yml'}"]
    proc = subprocess.run(
        [*argv, *(["--check"] if check else []), str(tmp_path / "play.yml")],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    marker = out.rfind('"msg": "COPY=')
    assert proc.returncode == 0 and marker >= 0, out
    copy = json.loads(json.loads("{" + out[marker:].split("\n", 1)[0] + "}")["msg"][len("COPY=") :])
    return out, copy


def test_the_copy_runs_once_and_again_only_when_a_side_changed(tmp_path):
    source = tmp_path / "controller" / "tiny"
    source.mkdir(parents=True)
    (source / "config.json").write_text('{"a": 1}\n')
    (source / "model.safetensors").write_bytes(b"weights" * 100)
    (tmp_path / "etc").mkdir()  # configure.yml makes it before it stages the model
    copied = tmp_path / "home" / "models" / "tiny"
    stamp = tmp_path / "etc" / "model-copy.stamp"

    out, copy = run(tmp_path)
    assert copy.get("changed") is True, out
    assert (copied / "model.safetensors").read_bytes() == b"weights" * 100
    first_stamp = stamp.read_text()

    # Nothing changed on either side: no copy (no checksums), the stamp as it was.
    out, copy = run(tmp_path)
    assert copy.get("skipped") is True, out
    assert stamp.read_text() == first_stamp

    # A check-mode run reads and changes nothing either.
    out, copy = run(tmp_path, check=True)
    assert copy.get("skipped") is True, out

    # A file edited on the host: the copy puts the controller's back.
    (copied / "model.safetensors").write_bytes(b"tampered")
    out, copy = run(tmp_path)
    assert copy.get("changed") is True, out
    assert (copied / "model.safetensors").read_bytes() == b"weights" * 100
    out, copy = run(tmp_path)
    assert copy.get("skipped") is True, out

    # A file removed on the host, then a new model on the controller: copied each time.
    (copied / "config.json").unlink()
    out, copy = run(tmp_path)
    assert copy.get("changed") is True and (copied / "config.json").exists(), out
    (source / "config.json").write_text('{"a": 2, "b": 3}\n')
    out, copy = run(tmp_path)
    assert copy.get("changed") is True, out
    assert (copied / "config.json").read_text() == '{"a": 2, "b": 3}\n'

    # Without preflight's digest (the role run on its own), the copy runs every time, as the copy module decides.
    out, copy = run(tmp_path, with_digest=False)
    assert copy.get("skipped") is not True and copy.get("changed") is False, out
