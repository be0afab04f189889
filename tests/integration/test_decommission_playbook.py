"""playbooks/decommission.yml through ansible-playbook (issue 41, item 12): hosts named with -e decommission_hosts
leave every load balancer (drained, in-flight requests done, then deleted live and from haproxy.cfg), then service.

Three vLLM hosts (`web`, `web-2`, `api`: `web-2-vllm-0` is never `web`'s), two servers each, behind two load
balancers, all this machine (connection local). No HAProxy runs (the pattern of test_rollout_capacity.py and
test_lb_batch_edits.py): `socat` on PATH stands in for each load balancer's admin socket, told apart by the load
balancer's Python (a wrapper per load balancer: a delegated task runs the delegated host's interpreter), with the
real headers, the servers in a JSON file per load balancer and every command logged; `haproxy` stands in for
`haproxy -c` and refuses a file without the backend or with a malformed server line. Each load balancer has its own
haproxy.cfg (-e loadbalancer_haproxy_config names it by loadbalancer_view_name). The run locks and the converged
records live in the test's directory. Each host's plan still has one of its two instances: a decommission removes
both servers whatever the plan says.

The host part (vllm_service decommission) runs against this machine for `web`: with no vllm@ unit configured here
it stops nothing (a systemd stop is not run here); what it can show is the firewall's rules file removed (its
vllm_service_config_dir is the test's) and the converged record removed. A machine that has vLLM instances or the
role's firewall unit skips the tests that reach the host part.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, state_helper_args

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
PLAYBOOK = str(REPO / "playbooks" / "decommission.yml")
HOSTS = ("web", "web-2", "api")
LBS = ("lb1", "lb2")
UNREACHABLE = {
    "ansible_connection": "ssh",
    "ansible_host": "192.0.2.1",  # TEST-NET-1: never answers
    "ansible_ssh_common_args": "-o ConnectTimeout=2 -o BatchMode=yes",
}
# A plan a host may still have in the run (a fact cache, an inventory that sets it): it keeps vllm-0, yet every
# server of a decommissioned host goes.
PLAN = {"instances": [{"name": "vllm-0", "port": 8000}]}
# What the admin socket is asked that changes a server.
CHANGING = ("set server", "del server", "add server", "enable", "disable")

FAKE_SOCAT = """#!{python}
import fcntl, json, os, sys
# Every load balancer here is this machine: its Python (the delegated host's interpreter) names it.
base = os.path.join(os.environ["FAKE_LB_DIR"], os.environ["FAKE_LB"])
line = sys.stdin.read().strip()
with open(base + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    servers = json.load(open(base + ".json"))
    with open(base + ".log", "a") as log:
        log.write(line + "\\n")
    out = []
    for command in [c.strip() for c in line.split(";")]:
        words = command.split()
        if words[:3] == ["show", "servers", "state"]:
            out.append("1")
            out.append("# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight")
            for i, (name, s) in enumerate(servers.items()):
                admin = {{"ready": 0, "maint": 1, "drain": 8}}[s["admin"]]
                out.append(f"3 vllm {{i + 1}} {{name}} 10.0.0.1 {{2 if s['up'] else 0}} {{admin}} 1")
        elif words[:2] == ["show", "stat"]:
            out.append("# pxname,svname,scur,")
            out.extend(f"vllm,{{name}},0," for name in servers)
        elif words[:2] == ["set", "server"] and words[3] == "state":
            servers[words[2].split("/")[1]]["admin"] = words[4]
            out.append("")
        elif words[:2] == ["del", "server"]:
            name = words[2].split("/")[1]
            if servers[name]["admin"] != "maint":
                out.append("Only servers in maintenance mode can be deleted.")
            else:
                del servers[name]
                out.append("Server deleted.")
        else:
            sys.exit("unexpected command: " + command)
    with open(base + ".json.new", "w") as new:
        json.dump(servers, new)
    os.replace(base + ".json.new", base + ".json")
print("\\n".join(out))
"""

# `haproxy -c -f FILE`: refuses what HAProxy would not parse in these tests.
FAKE_HAPROXY = """#!{python}
import re, sys
text = open(sys.argv[sys.argv.index("-f") + 1]).read()
if not re.search(r"^backend vllm$", text, re.M):
    sys.exit("no backend vllm")
for line in text.splitlines():
    if line.split()[:1] == ["server"] and not re.fullmatch(r"\\s+server \\S+ [0-9.]+:[0-9]+( \\S+)*", line):
        sys.exit("bad server line: " + line)
print("Configuration file is valid")
"""


def address(host):
    return f"10.0.0.{HOSTS.index(host) + 1}"


def servers(hosts=HOSTS):
    return [f"{host}-vllm-{n}" for host in hosts for n in (0, 1)]


def config_text():
    lines = ["global", "    stats socket /run/haproxy/admin.sock mode 660 level admin", "", "backend vllm",
             "    balance leastconn"]  # fmt: skip
    lines += [f"    server {host}-vllm-{n} {address(host)}:{8000 + n} check" for host in HOSTS for n in (0, 1)]
    return "\n".join(lines) + "\n"


def host_part_would_touch_this_machine():
    units = Path("/etc/systemd/system")
    return bool(list(units.glob("vllm@*.service.d"))) or (units / "vllm-firewall.service").exists()


class Fleet:
    """The inventory, the stand-ins and the load balancers' files under tmp_path."""

    def __init__(self, tmp_path, states=None, unreachable=()):
        self.dir = tmp_path
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "socat").write_text(FAKE_SOCAT.format(python=sys.executable))
        (bin_dir / "haproxy").write_text(FAKE_HAPROXY.format(python=sys.executable))
        for lb in LBS:
            (bin_dir / f"python-{lb}").write_text(f'#!/bin/sh\nFAKE_LB={lb} exec {sys.executable} "$@"\n')
        for tool in bin_dir.iterdir():
            tool.chmod(0o755)
        for lb in LBS:
            live = {name: {"admin": "ready", "up": True} for name in servers()}
            live.update((states or {}).get(lb, {}))
            (tmp_path / f"{lb}.json").write_text(json.dumps(live))
            (tmp_path / f"{lb}.cfg").write_text(config_text())
        # Each host's converged record; the vLLM hosts' firewall rules in their own config directory.
        for name in HOSTS + LBS:
            (tmp_path / name).mkdir()
            (tmp_path / name / "converged.json").write_text("{}\n")
        for host in HOSTS:
            (tmp_path / host / "etc-vllm").mkdir()
            (tmp_path / host / "etc-vllm" / "firewall.nft").write_text("table inet vllm_fleet {}\n")

        def own(name):
            return {"vllm_fleet_run_lock": str(tmp_path / name / "run.lock"),
                    "vllm_fleet_converged_record": str(tmp_path / name / "converged.json")}  # fmt: skip

        vllm_hosts = {
            host: {**own(host), "ansible_host": address(host), "vllm_plan": PLAN,
                   "vllm_service_config_dir": str(tmp_path / host / "etc-vllm"),
                   **(UNREACHABLE if host in unreachable else {})}
            for host in HOSTS
        }  # fmt: skip
        lbs = {lb: {**own(lb), "ansible_python_interpreter": str(bin_dir / f"python-{lb}"),
                    **(UNREACHABLE if lb in unreachable else {})} for lb in LBS}  # fmt: skip
        inventory = {
            "all": {
                "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
                "children": {"vllm_hosts": {"hosts": vllm_hosts}, "loadbalancers": {"hosts": lbs},
                             "builders": {"hosts": {}}, "monitoring": {"hosts": {}}},
            }
        }  # fmt: skip
        (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
        self.env = dict(
            os.environ,
            PATH=f"{bin_dir}:{os.environ['PATH']}",
            FAKE_LB_DIR=str(tmp_path),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_FORCE_COLOR="0",
            ANSIBLE_RETRY_FILES_ENABLED="0",
            ANSIBLE_STDOUT_CALLBACK="default",
            ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        )
        self.runs = 0

    def run(self, *extra):
        """One ansible-playbook run; returns (rc, output, {lb: admin socket commands of this run})."""
        before = {lb: len(self.log(lb)) for lb in LBS}
        argv = [ANSIBLE_PLAYBOOK, "-i", str(self.dir / "inventory.yml"), PLAYBOOK,
                "-e", "loadbalancer_haproxy_config=" + str(self.dir) + "/{{ loadbalancer_view_name }}.cfg",
                *state_helper_args(self.dir),
                "-e", "loadbalancer_drain_timeout=4", *extra]  # fmt: skip
        done = subprocess.run(argv, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=300, check=False)
        self.runs += 1
        return done.returncode, done.stdout + done.stderr, {lb: self.log(lb)[before[lb] :] for lb in LBS}

    def log(self, lb):
        path = self.dir / f"{lb}.log"
        return path.read_text().splitlines() if path.exists() else []

    def live(self, lb):
        return json.loads((self.dir / f"{lb}.json").read_text())

    def config(self, lb):
        return (self.dir / f"{lb}.cfg").read_text()

    def locks(self):
        """{host: the run lock's holder, {} when free} of every host with a lock file."""
        out = {}
        for path in sorted(self.dir.glob("*/run.lock")):
            text = path.read_text()
            out[path.parent.name] = json.loads(text) if text.strip() else {}
        return out


def changing(commands):
    return [line for line in commands if any(part.strip().startswith(CHANGING) for part in line.split(";"))]


def without(config, host):
    return "".join(line for line in config.splitlines(keepends=True) if f" server {host}-vllm-" not in line)


@pytest.fixture
def needs_host_part():
    if host_part_would_touch_this_machine():
        pytest.skip("this machine has vllm@ units or vllm-firewall.service: the host part would stop them")


def test_a_host_is_drained_then_removed_on_every_lb_stopped_and_a_second_run_changes_nothing(tmp_path, needs_host_part):
    fleet = Fleet(tmp_path)
    rc, out, commands = fleet.run("-e", "decommission_hosts=web")
    assert rc == 0, out[-4000:]
    for lb in LBS:
        log = commands[lb]
        drains = [i for i, line in enumerate(log) if line.endswith(" state drain")]
        waits = [i for i, line in enumerate(log) if line.startswith("show stat vllm")]
        deletes = [i for i, line in enumerate(log) if "del server" in line]
        # Drained first (both servers), in-flight waited for, then deleted live: nothing else changed.
        assert [log[i] for i in drains] == ["set server vllm/web-vllm-0 state drain",
                                            "set server vllm/web-vllm-1 state drain"], log  # fmt: skip
        assert [log[i] for i in deletes] == [f"set server vllm/{name} state maint; del server vllm/{name}"
                                             for name in servers(["web"])], log  # fmt: skip
        assert waits and max(drains) < min(waits) < min(deletes), log
        assert sorted(changing(log)) == sorted([log[i] for i in drains + deletes]), log
        # Gone live and from haproxy.cfg; web-2's and api's servers and lines are as they were.
        assert fleet.live(lb) == {name: {"admin": "ready", "up": True} for name in servers(["web-2", "api"])}
        assert fleet.config(lb) == without(config_text(), "web"), fleet.config(lb)
    # The host part: the firewall's rules and the converged record gone on web only; every lock given back.
    assert not (tmp_path / "web" / "etc-vllm" / "firewall.nft").exists()
    assert (tmp_path / "web-2" / "etc-vllm" / "firewall.nft").exists()
    assert not (tmp_path / "web" / "converged.json").exists()
    assert all((tmp_path / name / "converged.json").exists() for name in ["web-2", "api", *LBS])
    assert fleet.locks() == {"lb1": {}, "lb2": {}, "web": {}}, fleet.locks()
    assert "Next: remove web from the inventory" in out and "then run site.yml" in out, out[-3000:]

    configs = {lb: fleet.config(lb) for lb in LBS}
    rc, out, commands = fleet.run("-e", "decommission_hosts=web")
    assert rc == 0, out[-4000:]
    assert {lb: changing(log) for lb, log in commands.items()} == {lb: [] for lb in LBS}, commands
    assert {lb: fleet.config(lb) for lb in LBS} == configs
    assert fleet.locks() == {"lb1": {}, "lb2": {}, "web": {}}, fleet.locks()
    assert "web: no longer a server of any load balancer (lb1, lb2)" in out, out[-3000:]


def test_the_whole_fleet_goes_only_when_forced(tmp_path, needs_host_part):
    fleet = Fleet(tmp_path)
    rc, out, commands = fleet.run("-e", "decommission_hosts=web,web-2,api", "-e", "decommission_whole_fleet=true",
                                  "-e", "rollout_min_available=0")  # fmt: skip
    assert rc == 0, out[-4000:]
    for lb in LBS:
        assert fleet.live(lb) == {}
        assert " server " not in fleet.config(lb) and "backend vllm\n    balance leastconn\n" in fleet.config(lb)
        assert len([line for line in commands[lb] if "del server" in line]) == len(servers()), commands[lb]


DOWN_ON_LB2 = {"lb2": {name: {"admin": "ready", "up": False} for name in servers(["web-2"])}
               | {name: {"admin": "drain", "up": True} for name in servers(["api"])}}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "states", "unreachable", "refusal"),
    [
        ((), None, (), "vllm_hosts: decommission_hosts: names no host; fix: "),
        (("-e", "decommission_hosts= , "), None, (), "vllm_hosts: decommission_hosts: names no host; fix: "),
        (
            ("-e", "decommission_hosts=web,nosuch"),
            None,
            (),
            "nosuch: decommission_hosts: not a host of this inventory; fix: ",
        ),
        (("-e", "decommission_hosts=lb1"), None, (), "lb1: decommission_hosts: not in group vllm_hosts, "),
        (
            ("-e", "decommission_hosts=web,web-2,api"),
            None,
            (),
            "vllm_hosts: decommission_hosts: names every host of vllm_hosts (web, web-2, api): nothing would be left",
        ),
        (
            ("-e", "decommission_hosts=web", "--limit", "web"),
            None,
            (),
            "lb1: --limit: leaves out this load balancer, where the servers of web must go; fix: ",
        ),
        (
            ("-e", "decommission_hosts=web"),
            DOWN_ON_LB2,
            (),
            "lb2: rollout_min_available: 0 of 6 servers would stay UP and ready while web drain (2 of theirs);"
            " rollout_min_available is 1; not UP and ready already: ",
        ),
        (
            ("-e", "decommission_hosts=web"),
            None,
            ("lb2",),
            "lb2: loadbalancers: cannot be reached, so the servers of web",
        ),
    ],
    ids=["unset", "empty", "unknown-host", "not-a-vllm-host", "whole-fleet", "limit", "capacity", "lb-unreachable"],
)
def test_bad_input_is_refused_before_any_change(tmp_path, extra, states, unreachable, refusal):
    fleet = Fleet(tmp_path, states=states, unreachable=unreachable)
    live = {lb: fleet.live(lb) for lb in LBS}
    rc, out, commands = fleet.run(*extra)
    assert rc != 0, out[-4000:]
    assert "DECOMMISSION REFUSED, nothing was changed: " in out and refusal in out, out[-4000:]
    # Nothing changed: no state-changing admin socket command, the files, the servers, the records as they were,
    # no lock taken.
    assert {lb: changing(log) for lb, log in commands.items()} == {lb: [] for lb in LBS}, commands
    assert {lb: fleet.config(lb) for lb in LBS} == dict.fromkeys(LBS, config_text())
    assert {lb: fleet.live(lb) for lb in LBS} == live
    assert fleet.locks() == {}, fleet.locks()
    assert all((tmp_path / name / "converged.json").exists() for name in HOSTS + LBS)
    assert all((tmp_path / host / "etc-vllm" / "firewall.nft").exists() for host in HOSTS)


def test_check_mode_runs_the_checks_and_stops_before_any_change(tmp_path):
    fleet = Fleet(tmp_path)
    rc, out, commands = fleet.run("-e", "decommission_hosts=web", "--check")
    assert rc != 0, out[-4000:]
    assert "DECOMMISSION CHECKED, nothing was changed: web: --check: every check passed" in out, out[-4000:]
    assert {lb: changing(log) for lb, log in commands.items()} == {lb: [] for lb in LBS}, commands
    assert {lb: fleet.config(lb) for lb in LBS} == dict.fromkeys(LBS, config_text())
    assert fleet.locks() == {}, fleet.locks()


def test_a_host_that_does_not_answer_still_leaves_every_lb_and_the_run_says_its_part_was_not_done(tmp_path):
    fleet = Fleet(tmp_path, unreachable=("web",))
    for attempt in (1, 2):
        rc, out, commands = fleet.run("-e", "decommission_hosts=web")
        assert rc != 0, out[-4000:]
        assert (
            "DECOMMISSION NOT FINISHED: web: decommission_hosts: the host did not answer, so its vLLM instances" in out
        )
        assert "web: no longer a server of any load balancer (lb1, lb2)" in out, out[-4000:]
        for lb in LBS:
            assert fleet.live(lb) == {name: {"admin": "ready", "up": True} for name in servers(["web-2", "api"])}
            assert fleet.config(lb) == without(config_text(), "web"), fleet.config(lb)
            if attempt == 1:
                assert [line for line in changing(commands[lb]) if line.endswith("state drain")] == [
                    f"set server vllm/{name} state drain" for name in servers(["web"])
                ], commands[lb]
                assert len([line for line in commands[lb] if "del server" in line]) == 2, commands[lb]
            else:
                assert changing(commands[lb]) == [], commands[lb]
        # The load balancers' locks were taken and given back; web was not reached, so neither locked nor changed.
        assert fleet.locks() == {"lb1": {}, "lb2": {}}, fleet.locks()
        assert (tmp_path / "web" / "converged.json").exists()
