"""A server the new plan drops, through ansible-playbook and the loadbalancer role's own tasks (issue 31, item 8).

Host `web` planned two instances and now plans one: the load balancer has `web-vllm-0` and `web-vllm-1`. The
rollout drains every server of the host the load balancer has (backend_state.yml, drain), re-enables only the
instances configured on the host after the change (ready with loadbalancer_backend_instances), and after the gate
removes the dropped server (backend_retire.yml): its line from haproxy.cfg, the live server through the admin
socket (maintenance, then `del server`), no reload. A second removal changes nothing.

No HAProxy runs here: `socat` on PATH is a stand-in for HAProxy's admin socket (its answers have the real headers;
it keeps the servers in a JSON file and logs every command), `haproxy -c` one that accepts the file. Without the
change, the drain leaves `web-vllm-1` in service while its instance stops, and nothing removes it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO, state_helper_args

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")

FAKE_SOCAT = """#!{python}
import json, os, sys
state_path = os.environ["FAKE_HAPROXY_STATE"]
servers = json.load(open(state_path))
line = sys.stdin.read().strip()
with open(state_path + ".log", "a") as log:
    log.write(line + "\\n")
out = []
for command in [c.strip() for c in line.split(";")]:
    words = command.split()
    if words[:3] == ["show", "servers", "state"]:
        out.append("1")
        out.append("# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state")
        for i, (name, s) in enumerate(servers.items()):
            admin = {{"ready": 0, "maint": 1, "drain": 8}}[s["admin"]]
            out.append(f"3 vllm {{i + 1}} {{name}} 10.0.0.1 {{2 if s['up'] else 0}} {{admin}}")
    elif words[:2] == ["show", "stat"]:
        out.append("# pxname,svname,scur,")
        out.extend(f"vllm,{{name}},0," for name in servers)
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
json.dump(servers, open(state_path, "w"))
print("\\n".join(out))
"""

CONFIG = """global
    stats socket /run/haproxy/admin.sock mode 660 level admin

backend vllm
    balance leastconn
    server web-vllm-0 10.0.0.1:8000
    server web-vllm-1 10.0.0.1:8001
    server web-2-vllm-0 10.0.0.2:8000
"""


def run(tmp_path):
    """Drain, re-enable, remove and remove again; returns (rc, output, servers live, config, admin socket log)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "socat").write_text(FAKE_SOCAT.format(python=sys.executable))
    (bin_dir / "haproxy").write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    state = tmp_path / "servers.json"
    live = {name: {"admin": "ready", "up": True} for name in ("web-vllm-0", "web-vllm-1", "web-2-vllm-0")}
    state.write_text(json.dumps(live))
    config = tmp_path / "haproxy.cfg"
    config.write_text(CONFIG)

    plan = {"instances": [{"name": "vllm-0", "port": 8000}]}
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "vllm_hosts": {
                    "hosts": {
                        "web": {"ansible_host": "10.0.0.1", "vllm_plan": plan},
                        "web-2": {"ansible_host": "10.0.0.2", "vllm_plan": plan},
                    }
                },
                "loadbalancers": {"hosts": {"lb": {}}},
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))

    def lb_tasks(tasks_from, **extra):
        return {
            "name": f"{tasks_from} {extra}",
            "ansible.builtin.include_role": {
                "name": "vllm.cpu_fleet.loadbalancer",
                "tasks_from": tasks_from,
                "apply": {"delegate_to": "lb"},
            },
            "vars": {"loadbalancer_backend_host": "web", "loadbalancer_view_name": "lb", **extra},
        }

    plays = [
        {"hosts": "lb", "gather_facts": True, "gather_subset": ["!all", "min"], "tasks": []},
        {
            "hosts": "web",
            "gather_facts": False,
            "tasks": [
                lb_tasks("backend_state", loadbalancer_backend_state="drain"),
                {"ansible.builtin.copy": {"content": "{{ lookup('file', '" + str(state) + "') }}",
                                          "dest": str(tmp_path / "drained.json")}},
                # After the switch, only vllm-0 is configured on the host.
                lb_tasks("backend_state", loadbalancer_backend_state="ready",
                         loadbalancer_backend_instances=["vllm-0"]),
                {"ansible.builtin.copy": {"content": "{{ lookup('file', '" + str(state) + "') }}",
                                          "dest": str(tmp_path / "after_ready.json")}},
                lb_tasks("backend_retire"),
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
        [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"),
         "-e", f"loadbalancer_haproxy_config={config}", *state_helper_args(tmp_path),
         "-e", "loadbalancer_drain_timeout=4",
         "-e", "loadbalancer_ready_timeout=4"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    log_path = Path(str(state) + ".log")
    log = log_path.read_text().splitlines() if log_path.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, json.loads(state.read_text()), config.read_text(), log, tmp_path


def test_a_dropped_server_is_drained_with_its_host_kept_out_and_removed_after_the_gate(tmp_path):
    rc, output, live, config, log, tmp = run(tmp_path)
    # The drain covered the dropped server too; the other host's server was left alone.
    drained = json.loads((tmp / "drained.json").read_text())
    assert {name: s["admin"] for name, s in drained.items()} == {
        "web-vllm-0": "drain",
        "web-vllm-1": "drain",
        "web-2-vllm-0": "ready",
    }, drained
    assert rc == 0, output
    # The re-enable took back only the configured instance: the dropped one stayed drained while its instance stopped.
    after_ready = json.loads((tmp / "after_ready.json").read_text())
    assert after_ready["web-vllm-0"]["admin"] == "ready" and after_ready["web-vllm-1"]["admin"] == "drain", after_ready
    # Removed after the gate: its line from the configuration and the live server, without a reload.
    assert "web-vllm-1" not in config and "server web-vllm-0 10.0.0.1:8000" in config
    assert "server web-2-vllm-0 10.0.0.2:8000" in config
    assert sorted(live) == ["web-2-vllm-0", "web-vllm-0"], live
    deletions = [line for line in log if "del server" in line]
    # The second removal found nothing to do: one deletion only.
    assert deletions == ["set server vllm/web-vllm-1 state maint; del server vllm/web-vllm-1"], log
