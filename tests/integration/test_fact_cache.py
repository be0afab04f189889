"""Ansible's jsonfile fact cache with the vllm_plan role, over fake local hosts
(ansible_connection=local, each reading an expanded recorded tree through
vllm_plan_facts_root): a warm cache gives the plan a cold run gives; a host
whose boot id or cpuset changed is read again; without a cache nothing changes.

Whether a run used the cache is shown by tampering with it: a cached fact the
module confirmed reaches the plan, one it replaced does not.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
HOSTS = {"h-spr": "spr-2s-amx", "h-milan": "milan-container-cpuset", "h-icx": "icx-2s-snc2"}
# A cgroup memory limit the tampered cache claims: MAX_JOBS follows memory, so it shows in the plan.
TAMPERED_MEMORY_MIB = 65536


@pytest.fixture
def fleet(tmp_path, machine_root):
    roots = {host: machine_root(name) for host, name in HOSTS.items()}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": sys.executable,
                        "vllm_version": "0.32.0",
                    },
                    "children": {
                        "vllm_hosts": {
                            "hosts": {host: {"vllm_plan_facts_root": str(root)} for host, root in roots.items()}
                        }
                    },
                }
            }
        )
    )
    playbook = tmp_path / "plan.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Plan every host and write its plan",
                    "hosts": "vllm_hosts",
                    "gather_facts": False,
                    "roles": ["vllm.cpu_fleet.vllm_plan"],
                    "tasks": [
                        {
                            "name": "Write the plan",
                            "ansible.builtin.copy": {
                                "content": "{{ vllm_plan | to_json }}",
                                "dest": str(tmp_path / "plans") + "/{{ inventory_hostname }}.json",
                                "mode": "0644",
                            },
                        }
                    ],
                }
            ]
        )
    )
    (tmp_path / "plans").mkdir()

    def run(cache=None):
        env = {**os.environ, "ANSIBLE_FORKS": "3"}
        if cache:
            env.update(ANSIBLE_CACHE_PLUGIN="jsonfile", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(cache))
        result = subprocess.run(
            [ANSIBLE_PLAYBOOK, "-i", str(inventory), str(playbook)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600, check=False,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        return {host: json.loads((tmp_path / "plans" / f"{host}.json").read_text()) for host in HOSTS}

    return {"run": run, "roots": roots, "cache": tmp_path / "facts-cache"}


def cached(cache, host):
    """(path, facts) of a host's jsonfile entry; ansible-core 2.19 names it s1_<host> and wraps the facts."""
    (path,) = [p for p in cache.iterdir() if p.name in (host, f"s1_{host}")]
    data = json.loads(path.read_text())
    return path, json.loads(data["__payload__"]) if "__payload__" in data else data


def tamper(cache, host):
    path, facts = cached(cache, host)
    facts["vllm_cpu"]["memory_mib"] = TAMPERED_MEMORY_MIB
    data = json.loads(path.read_text())
    path.write_text(json.dumps(dict(data, __payload__=json.dumps(facts)) if "__payload__" in data else facts))


def test_the_cache_is_used_only_while_boot_id_and_cpuset_are_unchanged(fleet):
    run, roots, cache = fleet["run"], fleet["roots"], fleet["cache"]
    uncached = run()
    assert run(cache) == uncached, "a cold cache changed the plan"
    assert all("vllm_cpu_key" in cached(cache, host)[1] for host in HOSTS)
    assert run(cache) == uncached, "a warm cache changed the plan"

    for host in HOSTS:
        tamper(cache, host)
    tampered = run(cache)
    # The module confirmed each host's key, so the cached (here: tampered) facts were planned from.
    for host in HOSTS:
        assert tampered[host]["build"]["max_jobs"] != uncached[host]["build"]["max_jobs"], host

    # A reboot on one host, a narrower cpuset on another, nothing on the third.
    (roots["h-spr"] / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (roots["h-spr"] / "proc/sys/kernel/random/boot_id").write_text("0b6f9b1e-5d3a-4c1e-9a53-0c1d2e3f4a5b\n")
    (roots["h-milan"] / "sys/fs/cgroup/cpuset.cpus.effective").write_text("8-11,136-139\n")
    after = run(cache)
    assert after["h-spr"] == uncached["h-spr"], "the rebooted host was planned from the cache"
    assert after["h-icx"] == tampered["h-icx"], "an unchanged host was read again"
    fresh = run()
    assert after["h-milan"] == fresh["h-milan"], "the host whose cpuset changed was planned from the cache"
    assert after["h-milan"] != uncached["h-milan"]
    assert cached(cache, "h-milan")[1]["vllm_cpu"]["allowed_cpus"] == [8, 9, 10, 11, 136, 137, 138, 139]
