"""roles/vllm_service/tasks/model_hub.yml through ansible-playbook: the Hugging Face token reaches the download and
no command line (issue 32, item 7).

A task's `environment:` is written into the command Ansible runs (`sudo ... /bin/sh -c 'HF_TOKEN=... python ...'`),
which ps shows and sudo logs; -vvv prints that command as its EXEC line. The venv's python here is the real one
with a stand-in huggingface_hub that records what the download got. Run without become (the task's become_user
is the service account, which this machine has not): the command line is the same but for the sudo prefix.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
TOKEN = "hf_StandInToken0123456789abcdef"

STUB = """
import json, os, sys


class LocalEntryNotFoundError(Exception):
    pass


def snapshot_download(repo_id, local_files_only=False, token=None):
    with open(os.environ["HUB_RECORD"], "a") as out:
        out.write(json.dumps({"repo_id": repo_id, "local_files_only": local_files_only, "token": token,
                              "argv": sys.argv, "env_token": os.environ.get("HF_TOKEN"),
                              "hf_home": os.environ.get("HF_HOME")}) + "\\n")
    if local_files_only:
        raise LocalEntryNotFoundError(repo_id)
"""

PLAY = """
- name: Download a model as roles/vllm_service does
  hosts: all
  gather_facts: false
  tasks:
    - name: Download
      ansible.builtin.include_tasks: {repo}/roles/vllm_service/tasks/model_hub.yml
"""


def run(tmp_path, token):
    hub = tmp_path / "stub" / "huggingface_hub"
    hub.mkdir(parents=True)
    (hub / "__init__.py").write_text(STUB)
    (hub / "errors.py").write_text("from huggingface_hub import LocalEntryNotFoundError\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "stub"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    record = tmp_path / "record.jsonl"
    inventory = {
        "all": {
            "hosts": {"hub-host": None},
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "ansible_become": False,
                "vllm_service_venv": str(venv),
                "vllm_service_home": str(tmp_path / "home"),
                "vllm_service_user": "nobody",
                "vllm_service_model_id": "org/gated-model",
                "vllm_service_hf_token": token,
            },
        }
    }
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(PLAY.format(repo=REPO))
    result = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-vvv", "-i", str(tmp_path / "inventory.json"), str(tmp_path / "play.yml")],
        cwd=REPO,
        env={**os.environ, "HUB_RECORD": str(record), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    return result, [json.loads(line) for line in record.read_text().splitlines()]


def test_the_token_reaches_the_download_and_no_command_line(tmp_path):
    result, calls = run(tmp_path, TOKEN)
    # The local look-up first, then the download with the token.
    assert [(c["repo_id"], c["local_files_only"], c["token"]) for c in calls] == [
        ("org/gated-model", True, None),
        ("org/gated-model", False, TOKEN),
    ], calls
    assert calls[-1]["hf_home"] == str(tmp_path / "home" / "cache" / "huggingface")
    # Not in the download's arguments or environment, not in any command Ansible ran (its EXEC lines), not logged.
    assert not [c for c in calls if TOKEN in json.dumps(c["argv"]) or c["env_token"]], calls
    exec_lines = [line for line in result.stdout.splitlines() if "EXEC" in line]
    assert exec_lines, result.stdout[-2000:]
    assert TOKEN not in result.stdout + result.stderr


def test_no_token_downloads_anonymously(tmp_path):
    _unused, calls = run(tmp_path, "")
    assert calls[-1]["token"] is None and not calls[-1]["local_files_only"]
