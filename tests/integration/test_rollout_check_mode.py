"""`site.yml --check` through the rollout (issue 41, item 9): a dry run that says what would restart, and stops there.

The rollout in check mode went on into a host's drained change, where nothing can run (check mode skips the
snapshot's script and shell and the health gate's scripts), so a task failed on a skipped result and the rescue
printed a false `ROLLOUT STOPPED at <host> in phase …`. Now, in check mode, every host of a batch decides as in a
real run (vllm_service's preflight, its configure in check mode, the capacity floor), prints what would restart
behind a drain on which load balancers (`CHECK MODE: <host> would restart …; nothing was changed.`), and stops
there: no snapshot, drain, change, gate or rescue; a host a lost run left is named, not recovered; a host that serves
nothing yet is named, not converged.

The scenarios run playbooks/rollout.yml itself (its three plays) after a play that plans the host (roles/vllm_plan,
from a recorded machine), on the controller: one venv-mode host whose configuration, in a temporary root, does not
exist yet (so every planned instance would restart), behind two load balancers. Stand-ins on PATH: `socat` for each
load balancer's admin socket (the real `show servers state` header, states from a JSON file, every command logged),
`systemctl` (list-units says the host's instance runs, or nothing; every call logged). The real vllm_service
preflight and configure run, in check mode only (otherwise they would create the service account on the
controller). What check mode cannot show: whether the new configuration passes its health gate, and what the start
and the rollback would do; a real run's gate finds that out. The last tests run the plays around the rollout:
run_lock.yml, converged_record.yml and run_unlock.yml (already check-mode safe: kept so), and site.yml's smoke
test through the load balancers.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO, expand

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
MACHINE = "spr-2s-amx"
# Written where the roles name no variable for them; check mode must leave them as they were.
FIXED_PATHS = (
    "/etc/systemd/system/vllm@.service",
    "/etc/systemd/system/vllm@vllm-0.service.d",
    "/var/lib/vllm-rollback",
)
LBS = ["lb1", "lb2"]

FAKE_SOCAT = """#!{python}
import json, os, sys
# Every load balancer here is this machine: its Python (the delegated host's interpreter) names it.
socket = os.path.join(os.environ["FAKE_LB_DIR"], os.environ["FAKE_LB"] + ".sock")
line = sys.stdin.read().strip()
with open(socket + ".log", "a") as log:
    log.write(line + "\\n")
if line.split()[:3] != ["show", "servers", "state"]:
    print("")
    sys.exit(0)
servers = json.load(open(socket + ".json"))
print("1")
print("# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight")
for i, (name, s) in enumerate(sorted(servers.items())):
    admin = {{"ready": 0, "maint": 1, "drain": 8}}[s["admin"]]
    print(f"3 vllm {{i + 1}} {{name}} 10.0.0.{{i + 1}} {{2 if s['up'] else 0}} {{admin}} 1")
"""

# The host's instance runs (list-units); every other call is logged and answers nothing.
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/systemctl.log"
case "$1" in
  list-units) [ -n "$FAKE_SERVING" ] && echo "vllm@vllm-0.service loaded active running vLLM instance vllm-0" ;;
esac
exit 0
"""


def write_exe(path, text):
    path.write_text(text)
    path.chmod(0o755)


def run(tmp, serving=True, record=None, drained=False, dropped=False):
    """plan + playbooks/rollout.yml in check mode; returns (rc, output, socket commands per LB, systemctl calls)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    write_exe(bin_dir / "socat", FAKE_SOCAT.format(python=sys.executable))
    write_exe(bin_dir / "systemctl", FAKE_SYSTEMCTL)
    for lb in LBS:
        write_exe(bin_dir / f"python-{lb}", f'#!/bin/sh\nFAKE_LB={lb} exec {sys.executable} "$@"\n')
        # Two more serving hosts (outside this run) keep the capacity floor.
        live = {f"{h}-vllm-0": {"admin": "ready", "up": True} for h in ("h1", "h2", "h3")}
        live["h1-vllm-1"] = {"admin": "drain" if drained else "ready", "up": True}
        if dropped:
            # An instance the plan no longer has: a real run removes its server after the host's gate.
            live["h1-vllm-2"] = {"admin": "ready", "up": True}
        (tmp / f"{lb}.sock.json").write_text(json.dumps(live))
        (tmp / f"{lb}.sock.log").write_text("")
    state = tmp / "host" / "rollout"
    if record is not None:
        state.mkdir(parents=True)
        (state / "state.json").write_text(json.dumps(record))
    model = tmp / "controller-model" / "tiny-llama"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    host = tmp / "host"
    venv = tmp / "venv"
    for name in ("bin/vllm", "bin/python", "lib/libiomp5.so", "lib/libtcmalloc.so"):
        (venv / name).parent.mkdir(parents=True, exist_ok=True)
        write_exe(venv / name, "")
    h1 = {
        "vllm_version": "0.32.0",
        "vllm_plan_facts_root": str(expand.expand(MACHINE, tmp / "machines" / MACHINE)),
        "vllm_service_venv": str(venv),
        "vllm_service_distribution": "vllm",
        "vllm_install_active_link": str(host / "current"),
        "toolchain_facts": {"tcmalloc_path": str(venv / "lib" / "libtcmalloc.so")},
        "vllm_service_user": "vllm",
        "vllm_service_group": "vllm",
        "vllm_service_home": str(host / "home"),
        "vllm_service_config_dir": str(host / "etc-vllm"),
        "vllm_service_systemd_dir": str(host / "systemd"),
        "vllm_service_quadlet_dir": str(host / "quadlet"),
        "vllm_service_model_path": str(model),
        "vllm_service_served_model_name": "tiny-llama",
        "vllm_service_listen_address": "0.0.0.0",
        "vllm_service_firewall": "none",
        "vllm_fleet_backend_network_trusted": True,
        "vllm_service_api_key": "check-mode-key-15e26068dea123b6",
        "rollout_state_dir": str(state),
    }
    # A role variable (vars/main.yml): only extra vars beat it.
    (tmp / "extra.json").write_text(json.dumps({"vllm_service_python_dir": str(host / "python")}))
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "vllm_hosts": {"hosts": {"h1": h1}},
                "loadbalancers": {
                    "hosts": {lb: {"ansible_python_interpreter": str(bin_dir / f"python-{lb}")} for lb in LBS}
                },
            },
        }
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    plan = {
        "name": "Plan the host (the preflight play's part the rollout reads)",
        "hosts": "vllm_hosts",
        "gather_facts": False,
        "tasks": [{"name": "Plan", "ansible.builtin.include_role": {"name": "vllm.cpu_fleet.vllm_plan"}}],
    }
    rollout = {"name": "The rollout", "ansible.builtin.import_playbook": str(REPO / "playbooks" / "rollout.yml")}
    (tmp / "play.yml").write_text(yaml.safe_dump([plan, rollout], sort_keys=False))
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        FAKE_LB_DIR=str(tmp),
        FAKE_SERVING="1" if serving else "",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_STDOUT_CALLBACK="default",
        # One line per message (the YAML form folds long ones).
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        # Only tasks that ran show: a task named below did not run when it is not in the output.
        ANSIBLE_DISPLAY_SKIPPED_HOSTS="false",
    )
    argv = [ANSIBLE_PLAYBOOK, "-i", str(tmp / "inventory.yml"), str(tmp / "play.yml"), "--check"]
    before = outside()
    done = subprocess.run(
        [*argv, "-e", f"@{tmp / 'extra.json'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert outside() == before, "check mode changed the controller outside the test's directory"
    commands = {lb: (tmp / f"{lb}.sock.log").read_text().splitlines() for lb in LBS}
    log = bin_dir / "systemctl.log"
    calls = log.read_text().splitlines() if log.exists() else []
    return done.returncode, done.stdout + done.stderr, commands, calls


def outside():
    """The paths the roles write without a variable, and the service account."""
    found = subprocess.run(["getent", "passwd", "vllm"], capture_output=True, check=False).returncode == 0
    return [os.path.lexists(path) for path in FIXED_PATHS], found


def written(tmp):
    """What the run left under the host's paths (the recorded machine tree and the stand-ins are the test's)."""
    return sorted(str(p.relative_to(tmp)) for p in (tmp / "host").rglob("*")) if (tmp / "host").exists() else []


def state_changing(commands):
    return {lb: [c for c in lines if not c.startswith("show ")] for lb, lines in commands.items()}


def test_check_mode_says_what_would_restart_and_changes_nothing(tmp_path):
    rc, out, commands, calls = run(tmp_path)
    assert rc == 0, out[-6000:]
    assert "ROLLOUT STOPPED" not in out, out[-6000:]
    assert "h1: restarting vllm-0, vllm-1 behind a drain on lb1, lb2" in out, out[-6000:]
    assert "CHECK MODE: h1 would restart vllm-0, vllm-1 behind a drain on lb1, lb2; nothing was changed." in out
    # It stopped there: no snapshot, drain, change, gate or rescue was started.
    for task in (
        "Record the rollout",
        "Save what the host runs now",
        "Drain the host",
        "Restart the changed instances",
        "Undo this rollout's change",
    ):
        assert task not in out, task
    # Every load balancer was read (the host's servers, the capacity floor), and nothing else was sent.
    assert state_changing(commands) == {lb: [] for lb in LBS}, commands
    assert all(commands[lb] for lb in LBS), commands
    assert [c for c in calls if not c.startswith("list-units")] == [], calls
    assert written(tmp_path) == []
    # The keys never reach the output.
    assert "check-mode-key" not in out


def test_check_mode_recovers_nothing_and_names_what_a_lost_run_left(tmp_path):
    """A host a lost run left half switched and drained, with a server its plan dropped: named, nothing touched."""
    record = {"rollout": "20260101T000000Z-1", "phase": "switch", "from": "/opt/vllm/0.31.0", "to": "/opt/vllm/0.32.0",
              "snapshot": "gone", "lb_before": {}, "at": "2026-01-01T00:00:00+00:00"}  # fmt: skip
    rc, out, commands, calls = run(tmp_path, record=record, drained=True, dropped=True)
    assert rc == 0, out[-6000:]
    assert "ROLLOUT STOPPED" not in out, out[-6000:]
    assert "RECOVERING h1: rollout 20260101T000000Z-1 left it in phase switch" in out, out[-6000:]
    assert "drained on lb1, lb2" in out
    assert "CHECK MODE: h1 would be recovered as said above, behind a drain on lb1, lb2, before its change" in out
    assert (
        "CHECK MODE: h1 would restart vllm-0, vllm-1 behind a drain on lb1, lb2; its dropped servers would leave"
        " lb1, lb2; nothing was changed." in out
    ), out[-6000:]
    for task in (
        "Write this run's configuration",
        "Start what is not running",
        "RECOVERED",
        "Remove their lines",
        "Delete them from the running HAProxy",
    ):
        assert task not in out, task
    assert state_changing(commands) == {lb: [] for lb in LBS}, commands
    assert [c for c in calls if not c.startswith("list-units")] == [], calls
    # The record is the lost run's, as it was.
    assert written(tmp_path) == ["host/rollout", "host/rollout/state.json"]
    assert json.loads((tmp_path / "host" / "rollout" / "state.json").read_text()) == record


def test_check_mode_says_a_new_host_would_be_served_and_changes_nothing(tmp_path):
    """The first play's host that serves nothing yet: named; not converged (nothing installed it in check mode)."""
    rc, out, commands, calls = run(tmp_path, serving=False)
    assert rc == 0, out[-6000:]
    assert (
        "CHECK MODE: h1 serves nothing yet: it would be converged in place and start vllm-0, vllm-1 (nothing to"
        " drain); nothing was changed." in out
    ), out[-6000:]
    assert "Serve on this host" not in out and "Wait for /health" not in out and "is not healthy" not in out
    assert state_changing(commands) == {lb: [] for lb in LBS}, commands
    assert [c for c in calls if not c.startswith("list-units")] == [], calls
    assert written(tmp_path) == []


def test_check_mode_takes_no_run_lock_and_writes_no_converged_record(tmp_path):
    """The plays around the rollout: the real run_lock.yml, converged_record.yml and run_unlock.yml, in check mode."""
    unit = tmp_path / "unit"
    unit.write_text("[Unit]\n")
    witness = {"files": [str(unit)], "units": ["vllm@vllm-0.service"]}
    hosts = {
        name: {
            "vllm_fleet_run_lock": str(tmp_path / name / "run.lock"),
            "vllm_fleet_converged_inputs": {"record": str(tmp_path / name / "converged.json")},
            "vllm_fleet_converged": {"inputs": {"own": {"k": 1}, "peers": {}}},
        }
        for name in ("h1", "lb1")
    }
    hosts["h1"].update(toolchain_witness=witness, vllm_install_witness=witness, vllm_service_witness=witness)
    hosts["lb1"].update(loadbalancer_witness=witness)
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "vllm_hosts": {"hosts": {"h1": hosts["h1"]}},
                "loadbalancers": {"hosts": {"lb1": hosts["lb1"]}},
                # What preflight makes of hosts this run changes.
                "vllm_fleet_changing": {"hosts": {"h1": {}, "lb1": {}}},
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    plays = [
        {"ansible.builtin.import_playbook": str(REPO / "playbooks" / name)}
        for name in ("run_lock.yml", "converged_record.yml", "run_unlock.yml")
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_RETRY_FILES_ENABLED="0")
    argv = [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"), "--check"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    # The record would change (the module says so in check mode) and the lock was read, not taken.
    record = out.split("TASK [Write the converged record", 1)[1].split("PLAY [", 1)[0]
    assert "changed: [h1]" in record and "changed: [lb1]" in record, out[-6000:]
    assert "holds the run lock on 2 host(s)" in out, out[-6000:]
    # No lock file, no record, not even their directories.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inventory.yml", "play.yml", "unit"], out[-3000:]


def test_check_mode_sends_no_smoke_request_through_the_load_balancers(tmp_path):
    """site.yml's play after the rollout, taken from playbooks/site.yml: in check mode it says so and sends nothing.

    Nothing listens on the load balancer's port here, so a request would fail the run; before, the first request was
    skipped (uri has no check mode) and the second failed on its missing answer."""
    plays = yaml.safe_load((REPO / "playbooks" / "site.yml").read_text())
    smoke = next(play for play in plays if play.get("name") == "Check the fleet answers through each load balancer")
    (tmp_path / "play.yml").write_text(yaml.safe_dump([smoke], sort_keys=False))
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "vllm_hosts": {"hosts": {"h1": {"vllm_service_api_key": "check-mode-key-15e26068dea123b6"}}},
                "loadbalancers": {"hosts": {"lb1": {}}},
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    argv = [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"), "--check"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "CHECK MODE: no request was sent through lb1" in out, out[-6000:]
