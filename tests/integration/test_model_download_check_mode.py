"""A model to download restarts every instance, so the rollout's check-mode pass must see it (issue 31, item 8).

roles/vllm_service/tasks/model_hub.yml runs here through ansible-playbook, as the rollout runs configure.yml
(include with `apply: check_mode: true`), against a stand-in venv whose huggingface_hub keeps its "cache" in
HF_HOME. Before the change the download was a command that check mode skips: the check-mode pass said nothing
changes, the host took the undrained "converge in place" path, and the real pass downloaded and restarted every
instance under traffic. Now check mode reports the download without doing it; the real pass downloads; then nothing.
"""

import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")

HUB = """
import os
from pathlib import Path


def snapshot_download(repo_id, local_files_only=False, token=None):
    done = Path(os.environ["HF_HOME"]) / (repo_id.replace("/", "--") + ".done")
    if local_files_only and not done.exists():
        from huggingface_hub.errors import LocalEntryNotFoundError
        raise LocalEntryNotFoundError(repo_id)
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text("weights")
    return str(done)
"""


def test_check_mode_reports_the_download_without_doing_it(tmp_path):
    venv = tmp_path / "venv"
    hub = tmp_path / "site" / "huggingface_hub"
    hub.mkdir(parents=True)
    (hub / "__init__.py").write_text(HUB)
    (hub / "errors.py").write_text("class LocalEntryNotFoundError(Exception):\n    pass\n")
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "site"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    home = tmp_path / "home"
    result = tmp_path / "passes.txt"
    task = {
        "ansible.builtin.include_role": {"name": "vllm.cpu_fleet.vllm_service", "tasks_from": "model_hub"},
        "vars": {
            "vllm_service_venv": str(venv),
            "vllm_service_home": str(home),
            "vllm_service_user": "root",
            "vllm_service_model_id": "org/tiny",
            "vllm_service_hf_token": "",
        },
    }
    done = home / "cache" / "huggingface" / "org--tiny.done"
    # After each pass: whether it said "changed" and whether the model is there.
    record = {
        "ansible.builtin.shell": (
            f'echo "{{{{ item }}}} {{{{ vllm_service_model is changed }}}}'
            f' $(test -e {done} && echo present || echo absent)" >> {result}'
        ),
        "check_mode": False,
    }

    def step(name, check):
        include = task["ansible.builtin.include_role"]
        apply = {"apply": {"check_mode": True}} if check else {}
        return [{**task, "ansible.builtin.include_role": {**include, **apply}}, {**record, "loop": [name]}]

    play = {
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {"ansible_become_method": "su", "ansible_python_interpreter": sys.executable},
        "tasks": [*step("check", True), *step("real", False), *step("again", True)],
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert result.read_text().splitlines() == [
        "check True absent",  # reported, not downloaded
        "real True present",
        "again False present",
    ], output
