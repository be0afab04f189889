"""A batch of 8 hosts edits the same load balancer's haproxy.cfg at once (issue 41, item 1; review day2-fleet-shape N1).

The rollout moves each host's servers (backend_endpoints.yml) and removes the servers its plan dropped
(backend_retire.yml) per host, delegated to every load balancer, for all the hosts of a batch in parallel. Each
edit is an `ansible.builtin.replace` of the whole file (read, substitute, rename over it): without serialising
the writers per load balancer, the last writer's view wins and the other hosts' edits are lost while every task
says `changed`; at the next reload HAProxy takes the old endpoints back from the file, and removed servers return.

Here: 8 hosts in one batch (serial 8, forks 10), each with two servers on one load balancer `lb` (connection
local), whose plans now have one instance on a new port. They run the loadbalancer role's own entry points the way
roles/rollout does (include_role with apply delegate_to, looped over the load balancers with loop_var rollout_lb):
read the moves (loadbalancer_endpoints_apply false), move, then remove the dropped servers. Every host's line must
have moved in the file, and every dropped line gone.

No HAProxy runs here (the pattern of test_retired_servers_playbook.py): `socat` on PATH is a stand-in for the admin
socket (real headers; the servers kept in a JSON file under a lock, as HAProxy serialises its own CLI), and
`haproxy` a stand-in for `haproxy -c` that sleeps 0.1 s (about what a real check of a small file takes, which
widens the window the old tasks raced in) and refuses a file without the backend or with a malformed server line.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, state_helper_args

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
HOSTS = [f"node{i}" for i in range(8)]

FAKE_SOCAT = """#!{python}
import fcntl, json, os, sys
state_path = os.environ["FAKE_HAPROXY_STATE"]
line = sys.stdin.read().strip()
with open(state_path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    servers = json.load(open(state_path))
    with open(state_path + ".log", "a") as log:
        log.write(line + "\\n")
    out = []
    for command in [c.strip() for c in line.split(";")]:
        words = command.split()
        if words[:3] == ["show", "servers", "state"]:
            out.append("1")
            out.append("# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_port")
            for i, (name, s) in enumerate(servers.items()):
                admin = {{"ready": 0, "maint": 1, "drain": 8}}[s["admin"]]
                out.append(f"3 vllm {{i + 1}} {{name}} {{s['addr']}} {{2 if s['up'] else 0}} {{admin}} {{s['port']}}")
        elif words[:2] == ["show", "stat"]:
            out.append("# pxname,svname,scur,")
            out.extend(f"vllm,{{name}},0," for name in servers)
        elif words[:2] == ["set", "server"] and words[3] == "addr":
            server = servers[words[2].split("/")[1]]
            old = server["port"]
            server["addr"], server["port"] = words[4], int(words[6])
            out.append(f"no need to change the addr, port changed from '{{old}}' to '{{words[6]}}', "
                       "by 'stats socket command'")
        elif words[:2] == ["set", "server"]:
            servers[words[2].split("/")[1]]["admin"] = words[4]
            out.append("")
        elif words[:2] == ["del", "server"]:
            name = words[2].split("/")[1]
            if servers[name]["admin"] != "maint":
                out.append("Only servers in maintenance mode can be deleted.")
            else:
                del servers[name]
                out.append("Server deleted.")
    with open(state_path + ".new", "w") as new:
        json.dump(servers, new)
    os.replace(state_path + ".new", state_path)
print("\\n".join(out))
"""

# `haproxy -c -f FILE`: slow like a real check, and refuses what HAProxy would not parse in these tests.
FAKE_HAPROXY = """#!{python}
import re, sys, time
time.sleep(0.1)
text = open(sys.argv[sys.argv.index("-f") + 1]).read()
if not re.search(r"^backend vllm$", text, re.M):
    sys.exit("no backend vllm")
for line in text.splitlines():
    if line.split()[:1] == ["server"] and not re.fullmatch(r"\\s+server \\S+ [0-9.]+:[0-9]+( \\S+)*", line):
        sys.exit("bad server line: " + line)
print("Configuration file is valid")
"""


def address(i):
    return f"10.0.0.{i + 1}"


def config_text():
    lines = ["global", "    stats socket /run/haproxy/admin.sock mode 660 level admin", "", "backend vllm",
             "    balance leastconn"]  # fmt: skip
    for i, host in enumerate(HOSTS):
        lines.append(f"    server {host}-vllm-0 {address(i)}:8000 check")
        lines.append(f"    server {host}-vllm-1 {address(i)}:8001 check")
    return "\n".join(lines) + "\n"


def lb_tasks(tasks_from, **extra):
    """The loadbalancer role's entry point, called as roles/rollout calls it (switch_loadbalancers.yml, main.yml)."""
    return {
        "name": f"{tasks_from} {sorted(extra)}",
        "ansible.builtin.include_role": {
            "name": "vllm.cpu_fleet.loadbalancer",
            "tasks_from": tasks_from,
            "apply": {"delegate_to": "{{ rollout_lb }}"},
        },
        "vars": {"loadbalancer_backend_host": "{{ inventory_hostname }}", "loadbalancer_view_name": "{{ rollout_lb }}",
                 **extra},
        "loop": "{{ rollout_loadbalancers }}",
        "loop_control": {"loop_var": "rollout_lb"},
    }  # fmt: skip


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Run the batch once: (rc, output, haproxy.cfg after, live servers after, admin socket log)."""
    tmp_path = tmp_path_factory.mktemp("lb_batch")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "socat").write_text(FAKE_SOCAT.format(python=sys.executable))
    (bin_dir / "haproxy").write_text(FAKE_HAPROXY.format(python=sys.executable))
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    state = tmp_path / "servers.json"
    live = {f"{host}-vllm-{n}": {"admin": "ready", "up": True, "addr": address(i), "port": 8000 + n}
            for i, host in enumerate(HOSTS) for n in (0, 1)}  # fmt: skip
    state.write_text(json.dumps(live))
    config = tmp_path / "haproxy.cfg"
    config.write_text(config_text())

    # The new plan: one instance (vllm-1 dropped), on port 8100 (vllm-0 moves).
    plan = {"instances": [{"name": "vllm-0", "port": 8100}]}
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "vllm_hosts": {"hosts": {host: {"ansible_host": address(i), "vllm_plan": plan}
                                         for i, host in enumerate(HOSTS)}},
                "loadbalancers": {"hosts": {"lb": {}}},
            },
        }
    }  # fmt: skip
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    plays = [
        {"hosts": "lb", "gather_facts": True, "gather_subset": ["!all", "min"], "tasks": []},
        {
            "hosts": "vllm_hosts",
            "serial": 8,
            "gather_facts": False,
            "vars": {"rollout_loadbalancers": ["lb"]},
            "tasks": [
                lb_tasks("backend_endpoints", loadbalancer_endpoints_apply=False),
                lb_tasks("backend_endpoints"),
                lb_tasks("backend_retire"),
            ],
        },
    ]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        FAKE_HAPROXY_STATE=str(state),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-f", "10", "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"),
         "-e", f"loadbalancer_haproxy_config={config}", *state_helper_args(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    log_path = Path(str(state) + ".log")
    log = log_path.read_text().splitlines() if log_path.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, config.read_text(), json.loads(state.read_text()), log


def test_the_batch_runs_and_moves_every_server_live(batch):
    rc, output, _config, live, log = batch
    assert rc == 0, output
    # The admin socket (runtime, one command per server) was never the problem: every move and deletion reached it.
    assert sorted(live) == sorted(f"{host}-vllm-0" for host in HOSTS), live
    assert {name: s["port"] for name, s in live.items()} == {f"{host}-vllm-0": 8100 for host in HOSTS}
    assert len([line for line in log if "del server" in line]) == len(HOSTS), log


def test_every_host_of_the_batch_has_its_line_moved_in_haproxy_cfg(batch):
    _rc, output, config, _live, _log = batch
    moved = [host for i, host in enumerate(HOSTS) if f"    server {host}-vllm-0 {address(i)}:8100\n" in config]
    assert moved == HOSTS, f"{len(moved)} of {len(HOSTS)} moves kept in haproxy.cfg:\n{config}\n{output[-3000:]}"
    assert not re.search(r"vllm-0 \S+:8000", config), config


def test_every_host_of_the_batch_has_its_dropped_line_removed_from_haproxy_cfg(batch):
    _rc, output, config, _live, _log = batch
    left = [host for host in HOSTS if f"server {host}-vllm-1 " in config]
    assert left == [], f"{len(left)} of {len(HOSTS)} removals lost in haproxy.cfg:\n{config}\n{output[-3000:]}"
    # Nothing else went: the section and its other lines are whole.
    assert config.startswith("global\n") and "backend vllm\n    balance leastconn\n" in config
    assert len([line for line in config.splitlines() if line.strip().startswith("server ")]) == len(HOSTS)
