"""roles/vllm_service/tasks/keys.yml through ansible-playbook: the copies of the API keys earlier versions of the
role left outside secrets.env are removed, and a second run changes nothing (issue 32, item 5).

Earlier versions passed both keys to vLLM in api-keys.yaml (--config) during a rotation, and vLLM 0.13 to 0.28
wrote VLLM_API_KEY verbatim into each compile cache directory's cache_key_factors.json (as json.dump(indent=2,
sort_keys=True) writes it), where a rotated key outlived its rotation.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")

PLAY = """
- name: Remove the key copies as roles/vllm_service does
  hosts: all
  gather_facts: false
  tasks:
    - name: Remove
      ansible.builtin.include_tasks: {repo}/roles/vllm_service/tasks/keys.yml
"""


def factors(key):
    env = {"VLLM_API_KEY": key, "VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_USE_V1": True}
    return json.dumps({"env": env, "config_hash": "abc", "code_hash": "def"}, indent=2, sort_keys=True)


def converge(tmp_path):
    inventory = {
        "all": {
            "hosts": {"h": None},
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "vllm_service_config_dir": str(tmp_path / "etc-vllm"),
                "vllm_service_home": str(tmp_path / "home"),
            },
        }
    }
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(PLAY.format(repo=REPO))
    result = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.json"), str(tmp_path / "play.yml")],
        cwd=REPO,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    return result.stdout


def test_key_copies_outside_secrets_env_are_removed_once(tmp_path):
    (tmp_path / "etc-vllm").mkdir()
    keys_file = tmp_path / "etc-vllm" / "api-keys.yaml"
    keys_file.write_text("api-key:\n- new-key\n- old-key\n")
    secrets = tmp_path / "etc-vllm" / "secrets.env"
    secrets.write_text('VLLM_SERVICE_API_KEY="new-key"\n')
    cache = tmp_path / "home" / "cache" / "vllm" / "torch_compile_cache"
    keyed = [cache / "1a2b" / "rank_0_0" / "backbone", cache / "3c4d" / "rank_0_0" / "backbone"]
    unkeyed = cache / "5e6f" / "rank_0_0" / "backbone"
    for directory, key in ((keyed[0], "old-key"), (keyed[1], "new-key"), (unkeyed, None)):
        directory.mkdir(parents=True)
        (directory / "cache_key_factors.json").write_text(factors(key))
        (directory / "model.py").write_text("# compiled\n")
    first = converge(tmp_path)
    assert not keys_file.exists()
    assert not [d for d in keyed if (d / "cache_key_factors.json").exists()]
    # What holds no key stays: the compiled code and a record written without a key (null).
    assert (unkeyed / "cache_key_factors.json").exists() and all((d / "model.py").exists() for d in keyed)
    assert secrets.read_text() == 'VLLM_SERVICE_API_KEY="new-key"\n'
    assert "changed=2" in first, first[-1500:]
    # Nothing left: a second run changes nothing.
    assert "changed=0" in converge(tmp_path)


def test_a_host_without_a_cache_yet_passes(tmp_path):
    (tmp_path / "home" / "cache").mkdir(parents=True)
    assert "changed=0" in converge(tmp_path)
