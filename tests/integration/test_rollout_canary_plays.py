"""One canary of each build class and service mode (issue 41, item 5), through ansible-playbook and the real plays.

A wheel or an image is per build class and per service mode: a class-B wheel that installs but fails its gate passed
the one class-A canary, then failed a whole batch of class B. playbooks/rollout.yml now puts one host of each (class,
mode) the batches change first (its order play, roles/rollout/tasks/order.yml) and the batch play follows that order
with the canaries as the default's first batch.

This runs the plays of playbooks/rollout.yml itself on local hosts (ansible_connection local), each as the file has
it, except two stand-ins: the first play (first_serve, which would start vLLM) only notes which hosts it served
(``first_served`` in the inventory), and the batch play's role is replaced by the role's real batch check (the task
"Check the batch is the one rollout_serial asks for", read from roles/rollout/tasks/main.yml) and a line naming the
batch. The hosts' build classes are the preflight's fact (``vllm_plan.build.build_class``), given as host variables.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
FIRST_PLAY = "Serve on hosts that serve nothing yet, all at once"
BATCH_PLAY = "Roll the change out to the serving hosts, one batch at a time"
CHECK_TASK = "Check the batch is the one rollout_serial asks for"
BATCH = re.compile(r'(?:"msg": "|msg: )BATCH (?P<hosts>[^"\n]*)')
# Inventory order: the class-B hosts are not first, and not together.
FLEET = {"a1": "avx512", "a2": "avx512", "b1": "amx", "a3": "avx512", "a4": "avx512", "b2": "amx", "a5": "avx512"}


def plays(check_task):
    """playbooks/rollout.yml's plays, the first play and the batch play's role stood in for."""
    source = yaml.safe_load((REPO / "playbooks" / "rollout.yml").read_text())
    out = []
    for play in source:
        play = dict(play)
        if play["name"] == FIRST_PLAY:
            play["tasks"] = [
                {
                    "name": "Stands for first_serve: note which hosts it served",
                    "ansible.builtin.set_fact": {"rollout_first_served": "{{ inventory_hostname in first_served }}"},
                }
            ]
        elif play["name"] == BATCH_PLAY:
            del play["roles"]
            play["tasks"] = [
                check_task,
                {
                    "name": "Name the batch",
                    "ansible.builtin.debug": {"msg": "BATCH {{ ansible_play_batch | join(' ') }}"},
                    "run_once": True,
                },
            ]
        out.append(play)
    assert [p["name"] for p in out].count(BATCH_PLAY) == 1, "the batch play's name is what molecule/serve reads"
    return out


def run(tmp_path, fleet, modes=None, first_served=(), inventory_serial=None, extra=()):
    """The rollout's plays over ``fleet`` ({host: build class}); returns (rc, output, the batches in order)."""
    check_task = next(
        task
        for task in yaml.safe_load((REPO / "roles" / "rollout" / "tasks" / "main.yml").read_text())
        if task.get("name") == CHECK_TASK
    )
    hosts = {
        host: {
            "vllm_plan": {"build": {"build_class": build_class}},
            "vllm_service_mode": (modes or {}).get(host, "venv"),
        }
        for host, build_class in fleet.items()
    }
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "first_served": list(first_served),
                # The role's default (its defaults are not loaded here), or the value of group_vars.
                "rollout_serial": inventory_serial,
            },
            "children": {"vllm_hosts": {"hosts": hosts}},
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays(check_task), sort_keys=False))
    env = dict(
        os.environ,
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_STDOUT_CALLBACK="default",
    )
    argv = [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"), *extra]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = done.stdout + done.stderr
    return done.returncode, out, [m.group("hosts").split() for m in BATCH.finditer(out)]


def test_the_first_batch_holds_one_host_of_each_build_class_and_one_class_is_batched_as_before(tmp_path):
    rc, out, batches = run(tmp_path, FLEET)
    assert rc == 0, out[-4000:]
    # a1 and b1, the first of each class in inventory order, then the others in inventory order,
    # 10% of 7 hosts (at least one) per batch; every host once.
    assert batches == [["a1", "b1"], ["a2"], ["a3"], ["a4"], ["b2"], ["a5"]], out[-4000:]
    assert "The rollout starts with a1, b1 (one host of each build class and service mode" in out

    # One class (the Molecule serve scenario's fleet is one class, venv): inventory order, one canary, as before.
    one = {host: "avx512" for host in FLEET}
    rc, out, batches = run(tmp_path, one)
    assert rc == 0, out[-4000:]
    assert batches == [[host] for host in FLEET], out[-4000:]


def test_a_service_mode_is_its_own_canary_and_a_first_served_host_is_never_one(tmp_path):
    # a1 runs the class's image (container): its own canary. b1 served nothing before this run (the first play
    # served it, and the batches do not change it): class amx's canary is b2.
    rc, out, batches = run(tmp_path, FLEET, modes={"a1": "container"}, first_served=["b1"])
    assert rc == 0, out[-4000:]
    assert batches[0] == ["a1", "a2", "b2"], out[-4000:]
    assert batches[1:] == [["b1"], ["a3"], ["a4"], ["a5"]], out[-4000:]


def test_limit_picks_the_canaries_among_the_hosts_of_the_run(tmp_path):
    rc, out, batches = run(tmp_path, FLEET, extra=["--limit", "vllm_hosts:!a1:!b1"])
    assert rc == 0, out[-4000:]
    assert batches == [["a2", "b2"], ["a3"], ["a4"], ["a5"]], out[-4000:]


def test_an_explicit_rollout_serial_is_applied_as_given_over_the_canary_first_order(tmp_path):
    rc, out, batches = run(tmp_path, FLEET, extra=["-e", "rollout_serial=3"])
    assert rc == 0, out[-4000:]
    assert batches == [["a1", "b1", "a2"], ["a3", "a4", "b2"], ["a5"]], out[-4000:]

    # The same value from the inventory never reaches the play's serial: the batch check stops the first batch.
    rc, out, batches = run(tmp_path, FLEET, inventory_serial=3)
    assert rc != 0
    assert batches == [], out[-4000:]
    assert "rollout_serial is 3 (batches of 3, 1 of" in out and "-e rollout_serial=3" in out, out[-4000:]
