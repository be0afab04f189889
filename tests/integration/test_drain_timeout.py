"""A drain whose requests outlast loadbalancer_drain_timeout fails when that time is up, not later (issue 41, rollout
speed: the wait polls every second and is bounded by the clock, each poll's own time included), and one whose last
request ends returns at the next poll. Through ansible-playbook and the loadbalancer role's backend_state entry
point, delegated as the rollout calls it; `socat` on PATH is test_lb_batch_edits' stand-in for the admin socket, its
`show stat` giving each server FAKE_SCUR requests in flight."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, state_helper_args
from test_lb_batch_edits import FAKE_SOCAT

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
SCUR_FROM_ENV = FAKE_SOCAT.replace(
    'out.extend(f"vllm,{{name}},0," for name in servers)',
    'out.extend(f"vllm,{{name}},{{os.environ.get(\'FAKE_SCUR\', \'0\')}}," for name in servers)',
)


@pytest.mark.parametrize(("in_flight", "timeout"), [(1, 3), (0, 3)], ids=["busy", "idle"])
def test_a_drain_waits_no_longer_than_its_timeout(tmp_path, in_flight, timeout):
    assert SCUR_FROM_ENV != FAKE_SOCAT  # the stand-in was changed as meant
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "socat").write_text(SCUR_FROM_ENV.format(python=sys.executable))
    (bin_dir / "socat").chmod(0o755)
    state = tmp_path / "servers.json"
    state.write_text(json.dumps({"web-vllm-0": {"admin": "ready", "up": True, "addr": "10.0.0.1", "port": 8000}}))
    inventory = {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {"vllm_hosts": {"hosts": {"web": {"vllm_plan": {"instances": [{"name": "vllm-0", "port": 8000}]}}}},
                     "loadbalancers": {"hosts": {"lb": {}}}},
    }}  # fmt: skip
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "haproxy.cfg").write_text("backend vllm\n    server web-vllm-0 10.0.0.1:8000 check\n")
    plays = [
        {"hosts": "lb", "gather_facts": True, "gather_subset": ["!all", "min"], "tasks": []},
        {"hosts": "web", "gather_facts": False, "tasks": [{
            "ansible.builtin.include_role": {"name": "vllm.cpu_fleet.loadbalancer", "tasks_from": "backend_state",
                                             "apply": {"delegate_to": "lb"}},
            "vars": {"loadbalancer_backend_host": "web", "loadbalancer_view_name": "lb",
                     "loadbalancer_backend_state": "drain"},
        }]},
    ]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_HAPROXY_STATE=str(state),
               FAKE_SCUR=str(in_flight), ANSIBLE_NOCOLOR="1")  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"),
         "-e", f"loadbalancer_drain_timeout={timeout}", "-e", f"loadbalancer_haproxy_config={tmp_path / 'haproxy.cfg'}",
         *state_helper_args(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert json.loads(state.read_text())["web-vllm-0"]["admin"] == "drain", output
    task = r"Wait until the drained servers have no request in flight"
    retrying = re.findall(rf"FAILED - RETRYING: \[web -> lb\]: {task} \((\d+) retries left\)", output)
    if in_flight:
        assert done.returncode != 0, output
        assert f"after {timeout} s (loadbalancer_drain_timeout) of draining" in output, output
        assert "web-vllm-0 (1 in flight)" in output, output
        # Polled every second (room for 2 x timeout polls; the earlier 2 s delay gave timeout / 2), and ended by the
        # clock with polls still left: each poll's own time does not stretch the wait beyond the timeout.
        assert retrying and int(retrying[0]) == 2 * timeout, (retrying, output[-2000:])
        assert int(retrying[-1]) > 0, retrying
    else:
        assert done.returncode == 0, output
        assert retrying == [], output
    # The whole run: Ansible's own start and the facts play, plus the wait, which is the timeout at most.
    assert took < 60, took
