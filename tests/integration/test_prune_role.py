"""roles/vllm_install tasks_from=prune through ansible-playbook, on the controller (local connection), against
install roots whose path holds a symlink (opt -> data/opt, as /opt on a data disk): what is left on disk
(review day2-edges, finding 3).

One run, one inventory host per scenario, each with its own root. Negative control: VLLM_PRUNE_TASKS=<a tasks
file> runs that file (include_tasks, e.g. `git show HEAD~:roles/vllm_install/tasks/prune.yml`) instead of the
role's prune.
"""

import json
import mmap
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
ENV = dict(os.environ, ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
SITE = Path("lib") / "python3.11" / "site-packages"

# host: (installed {name: mtime}, active, prune_versions, what the scenario adds, expected directories left)
SCENARIOS = {
    # commit.yml after a reinstall of the served version: the superseded base goes.
    "superseded": (
        {"0.31.0-x86_64": 1000, "0.32.0-x86_64": 2000, "0.32.0-x86_64-r1a2b3c4d": 3000},
        "0.32.0-x86_64-r1a2b3c4d",
        False,
        None,
        ["0.31.0-x86_64", "0.32.0-x86_64-r1a2b3c4d"],
    ),
    # upgrade.yml's prune, keep 2: the rollback version stays.
    "rollback": (
        {"0.30.0-x86_64": 1000, "0.31.0-x86_64": 2000, "0.32.0-x86_64": 3000},
        "0.32.0-x86_64",
        True,
        None,
        ["0.31.0-x86_64", "0.32.0-x86_64"],
    ),
    # upgrade.yml -e vllm_version=0.31.0 while 0.32.0 is installed: the live (older) directory stays.
    "upgrade_back": (
        {"0.30.0-x86_64": 1000, "0.31.0-x86_64": 2000, "0.32.0-x86_64": 3000},
        "0.31.0-x86_64",
        True,
        None,
        ["0.31.0-x86_64", "0.32.0-x86_64"],
    ),
    # An old version touched last: version order, not mtime order (and 0.9 < 0.10).
    "version_order": (
        {"0.9.0-x86_64": 9000, "0.10.0-x86_64": 1000, "0.11.0-x86_64": 2000},
        "0.11.0-x86_64",
        True,
        None,
        ["0.10.0-x86_64", "0.11.0-x86_64"],
    ),
    # A running process has loaded 0.29.0's libraries.
    "in_use": (
        {"0.29.0-x86_64": 1000, "0.31.0-x86_64": 2000, "0.32.0-x86_64": 3000},
        "0.32.0-x86_64",
        True,
        "process",
        ["0.29.0-x86_64", "0.31.0-x86_64", "0.32.0-x86_64"],
    ),
    # A rollout snapshot names 0.29.0 (the previous link target, as readlink wrote it).
    "snapshot": (
        {"0.29.0-x86_64": 1000, "0.31.0-x86_64": 2000, "0.32.0-x86_64": 3000},
        "0.32.0-x86_64",
        True,
        "snapshot",
        ["0.29.0-x86_64", "0.31.0-x86_64", "0.32.0-x86_64"],
    ),
}


def make_venv(real, name, mtime):
    venv = real / name
    (venv / SITE).mkdir(parents=True)
    (venv / SITE / "_fake.so").write_bytes(b"\0" * mmap.PAGESIZE)
    version = name.split("-")[0]
    record = {"wanted": {"version": version, "build_class": "x86_64"}, "imported_version": version + "+cpu"}
    (venv / "vllm-install.json").write_text(json.dumps(record))
    os.utime(venv, (mtime, mtime))


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    """Build every scenario's host, run the prune once for all; {host: (directories left, expected)}."""
    tmp = tmp_path_factory.mktemp("prune")
    hosts, holders = {}, []
    for host, (installed, active, prune_versions, extra, _unused) in SCENARIOS.items():
        real = tmp / host / "data" / "opt" / "vllm"
        real.mkdir(parents=True)
        (tmp / host / "opt").symlink_to(tmp / host / "data" / "opt")
        root = tmp / host / "opt" / "vllm"  # the path the inventory gives: through the link
        for name, mtime in installed.items():
            make_venv(real, name, mtime)
        (root / "current").symlink_to(root / active)  # as the rollout makes it
        state = tmp / host / "rollout"
        if extra == "snapshot":
            (state / "20250101T000000").mkdir(parents=True)
            (state / "20250101T000000" / "active").write_text(f"{root}/0.29.0-x86_64\n")
        if extra == "process":
            library = root / "0.29.0-x86_64" / SITE / "_fake.so"
            holder = subprocess.Popen(
                [sys.executable, "-c", "import mmap,sys,time; f=open(sys.argv[1],'rb');"
                 " m=mmap.mmap(f.fileno(),0,access=mmap.ACCESS_READ); print('ok',flush=True); time.sleep(300)",
                 str(library)],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            holders.append(holder)
            assert holder.stdout.readline().strip() == "ok"
        hosts[host] = {
            "vllm_install_root": str(root),
            "vllm_install_active_link": str(root / "current"),
            "vllm_install_prune_versions": prune_versions,
            "rollout_state_dir": str(state),
        }
    common = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vllm_version": "0.32.0",
        "vllm_install_keep_versions": 2,
    }
    inventory = tmp / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"vars": common, "hosts": hosts}}))
    tasks_file = os.environ.get("VLLM_PRUNE_TASKS")
    if tasks_file:
        step = f"ansible.builtin.include_tasks: {Path(tasks_file).resolve()}"
    else:
        step = "ansible.builtin.include_role: {name: vllm.cpu_fleet.vllm_install, tasks_from: prune}"
    playbook = tmp / "play.yml"
    playbook.write_text(
        textwrap.dedent(
            f"""\
            - hosts: all
              gather_facts: false
              tasks:
                - name: Prune
                  {step}
            """
        )
    )
    try:
        proc = subprocess.run(
            [ANSIBLE_PLAYBOOK, "-i", str(inventory), str(playbook)],
            cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return {
        host: (sorted(p.name for p in (tmp / host / "data" / "opt" / "vllm").iterdir()), ["current", *expected])
        for host, (*_unused, expected) in SCENARIOS.items()
    }, output


@pytest.mark.parametrize("host", sorted(SCENARIOS))
def test_what_is_left_on_disk(pruned, host):
    left, output = pruned
    found, expected = left[host]
    assert found == sorted(expected), f"{host}: left {found}, expected {sorted(expected)}\n{output[-3000:]}"


def test_the_active_link_still_leads_to_a_python_home(pruned):
    left, _unused = pruned
    for host, (found, _unused) in left.items():
        active = SCENARIOS[host][1]
        assert active in found, f"{host}: the directory the active link names ({active}) was removed"
