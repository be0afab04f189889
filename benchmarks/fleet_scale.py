"""Controller cost of facts and planning for N fake hosts, side by side with an empty and a ping play.

Run from the repo root:
  .venv/bin/python benchmarks/fleet_scale.py [--hosts 50,200] [--forks 20] [--label TEXT] [--no-fact-cache] [--write]

Every host is this machine (ansible_connection=local) reading one of several recorded machine
trees (tests/fixtures/machines, through vllm_plan_facts_root), so the figures are the
controller's: Ansible's per-host and per-task cost, module start-up, the planner. For each N it
runs, one after the other: an empty play, a ping play, the facts module alone with preflight's
subsets (the host's part of preflight: on these fake hosts it runs on the controller's CPUs too, so
preflight minus this row is the controller's own work), the facts-and-plan part of site.yml (its
plays before the toolchain play: preflight, and the plan play where there is one) and
playbooks/facts.yml, then both again with Ansible's jsonfile fact cache (a cold run fills it, the
timed warm runs confirm each host's cached facts by their key), and reports wall time, the
controller's CPU time (user + system of ansible-playbook and everything it waited for, from
wait4) and the peak RSS of its largest process. Ratios to the ping play are the comparable figures on a shared machine.
--write puts the table in the "## Fleet scale" section of docs/benchmarks.md under a sub-heading
named by its host counts ("### 50 and 200 hosts"), replacing the table of the same host counts: one
current table per fleet size.
"""

import argparse
import datetime
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ansible
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "machines"))
import expand  # noqa: E402

HEADING = "## Fleet scale"
# Hardware classes: Intel AMX (two generations), AMD AVX512-BF16, Intel AVX512-VNNI, an AVX2 desktop.
MACHINES = ("spr-2s-amx", "gnr-2s-snc3", "genoa-2s-nps4", "icx-2s-snc2", "adl-desktop-avx2")
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
# Ports no other program on this machine uses: preflight looks for foreign listeners on them.
BASE_PORT = 18400


def inventory(n, work):
    """N hosts in vllm_hosts, round-robin over MACHINES, with inputs that pass preflight."""
    model = work / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    wheels = work / "artifacts" / "x86_64"
    wheels.mkdir(parents=True)
    (wheels / "vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl").write_bytes(b"stand-in: preflight only looks for it")
    common = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vllm_version": "0.32.0",
        "vllm_plan_base_port": BASE_PORT,
        "vllm_plan_max_jobs": 1,
        "vllm_build_gcc122_workaround": True,
        # The fake hosts never build: no oneDNN source or torch wheel for preflight to ask the controller for.
        "vllm_build_onednn_tarball": "",
        "vllm_build_torch_source": "index",
        "vllm_build_python": sys.executable,
        "vllm_build_work_root": str(work / "build"),
        "vllm_build_ccache_dir": str(work / "ccache"),
        "vllm_install_source": "wheel",
        "vllm_install_deps_source": "index",
        "vllm_install_artifacts_dir": str(work / "artifacts"),
        "vllm_install_python": sys.executable,
        "vllm_install_root": str(work / "opt-vllm"),
        "vllm_install_host_wheelhouse": str(work / "host-wheelhouse"),
        "vllm_service_model_path": str(model),
        "vllm_service_api_key": "fleet-scale-key-7c2e9a4f1b6d3e80",
        # Every host is this controller: no listen address or firewall of its own.
        "vllm_service_listen_address": "0.0.0.0",
        "vllm_service_firewall": "none",
        "vllm_fleet_backend_network_trusted": True,
    }
    classes = {}
    for index, name in enumerate(MACHINES):
        root = expand.expand(name, work / "machines" / name)
        # Every fake host is this machine: each takes its own run lock, not the one file of the default path.
        hosts = {
            f"h{i:04d}": {"vllm_fleet_run_lock": str(work / "locks" / f"h{i:04d}.lock")}
            for i in range(index, n, len(MACHINES))
        }
        classes[name.replace("-", "_")] = {"hosts": hosts, "vars": {"vllm_plan_facts_root": str(root)}}
    return {"all": {"vars": common, "children": {"vllm_hosts": {"children": classes}}}}


def site_facts_and_plan(work):
    """site.yml's plays before the toolchain play (its imports are FQCNs): what runs before any change."""
    plays = []
    for play in yaml.safe_load((REPO / "playbooks" / "site.yml").read_text()):
        roles = [r.get("role") if isinstance(r, dict) else r for r in play.get("roles", [])]
        if "vllm.cpu_fleet.toolchain" in roles:
            break
        plays.append(play)
    path = work / "site_facts_and_plan.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return path, len(plays)


def playbooks(work):
    empty = work / "empty.yml"
    empty.write_text(yaml.safe_dump([{"name": "Empty", "hosts": "vllm_hosts", "gather_facts": False, "tasks": []}]))
    ping = work / "ping.yml"
    ping.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Ping",
                    "hosts": "vllm_hosts",
                    "gather_facts": False,
                    "tasks": [{"name": "Ping", "ansible.builtin.ping": None}],
                }
            ]
        )
    )
    # The host's part of preflight: the facts module with preflight's subsets and nothing on the controller.
    # On these fake hosts it runs on the controller's CPUs; preflight minus it is the controller's own work.
    facts_module = work / "facts_module.yml"
    facts_module.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Facts module alone",
                    "hosts": "vllm_hosts",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Read the facts",
                            "vllm.cpu_fleet.vllm_cpu_facts": {
                                "root": "{{ vllm_plan_facts_root }}",
                                "gather_subset": ["addresses", "systemd"],
                            },
                        }
                    ],
                }
            ]
        )
    )
    site, site_plays = site_facts_and_plan(work)
    site_name = f"site.yml facts+plan ({site_plays} {'entry' if site_plays == 1 else 'entries'} before toolchain)"
    facts = REPO / "playbooks" / "facts.yml"
    # (label, playbook, fact cache directory or None, whether the row is reported)
    cache = work / "facts-cache"
    return [
        ("empty play", empty, None, True),
        ("ping play", ping, None, True),
        ("vllm_cpu_facts alone (the host's part of preflight)", facts_module, None, True),
        (site_name, site, None, True),
        ("playbooks/facts.yml", facts, None, True),
        ("facts.yml, filling the jsonfile fact cache", facts, cache, False),
        (site_name.replace("site.yml", "site.yml, warm fact cache,"), site, cache, True),
        ("playbooks/facts.yml, warm fact cache", facts, cache, True),
    ]


def run(playbook, inventory_path, forks, work, log, cache=None):
    env = dict(
        os.environ,
        ANSIBLE_FORKS=str(forks),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        FLEET_REPORT_DIR=str(work / "reports"),
    )
    if cache:
        env.update(
            ANSIBLE_CACHE_PLUGIN="jsonfile", ANSIBLE_CACHE_PLUGIN_CONNECTION=str(cache), ANSIBLE_GATHERING="implicit"
        )
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            [ANSIBLE_PLAYBOOK, "-i", str(inventory_path), str(playbook)], cwd=REPO, env=env, stdout=out, stderr=out
        )
        # wait4: this run's own rusage (it and every process it waited for), not the sum of all runs.
        _unused, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    rc = os.waitstatus_to_exitcode(status)
    return {"rc": rc, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mib": usage.ru_maxrss / 1024}


def failures(text):
    """Each failed host's message in an ansible-playbook log (the default callback, YAML results): "host: msg"."""
    said, lines = [], text.splitlines()
    for index, line in enumerate(lines):
        match = re.match(r"(?:fatal|failed): \[([^\]]+)\]", line)
        if not match:
            continue
        block = []
        for following in lines[index + 1 :]:
            if following and not following[0].isspace():
                break
            block.append(following)
        try:
            body = yaml.safe_load("\n".join(block)) or {}
        except yaml.YAMLError:
            body = {}
        message = body.get("msg") if isinstance(body, dict) else None
        message = " ".join(str(message or line).split())
        said.append(message if message.startswith(f"{match[1]}: ") else f"{match[1]}: {message}")
    return said


def measure(sizes, forks, keep, fact_cache=True):
    rows = []
    for n in sizes:
        work = Path(tempfile.mkdtemp(prefix=f"fleet-scale-{n}-"))
        try:
            inventory_path = work / "inventory.yml"
            inventory_path.write_text(yaml.safe_dump(inventory(n, work)))
            for index, (what, playbook, cache, reported) in enumerate(playbooks(work)):
                if cache and not fact_cache:
                    continue
                log = work / f"{index}-{Path(playbook).stem}.log"
                result = run(playbook, inventory_path, forks, work, log, cache)
                if result["rc"]:
                    said = "\n".join(failures(log.read_text())) or log.read_text()[-4000:]
                    sys.exit(f"{what} at {n} hosts failed (rc {result['rc']}), log {log}:\n{said}")
                if not reported:
                    continue
                rows.append(dict(result, n=n, what=what))
                print(
                    f"{n} hosts, {what}: {result['wall']:.1f} s wall, {result['cpu']:.1f} s CPU, "
                    f"{result['rss_mib']:.0f} MiB",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            if keep:
                print(f"kept {work}", file=sys.stderr)
            else:
                shutil.rmtree(work, ignore_errors=True)
    return rows


def heading(sizes):
    """The sub-heading a run's table goes under: its host counts, '50 and 200 hosts'."""
    counts = [f"{n:,}" for n in sizes]
    return (", ".join(counts[:-1]) + " and " if len(counts) > 1 else "") + counts[-1] + " hosts"


def render(rows, label, command, load_before, load_after, started, note=""):
    ping = {row["n"]: row for row in rows if row["what"] == "ping play"}
    lines = [
        f"### {label}",
        "",
        f"`{command}`, {started:%Y-%m-%d %H:%M} UTC, ansible-core {ansible.__version__}, Python"
        f" {platform.python_version()}, {os.cpu_count()} CPUs; load average (1, 5, 15 min)"
        f" before {', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}."
        + (f" {note}" if note else ""),
        "",
        "| hosts | play | wall s | x ping | wall ms/host | controller CPU s | CPU ms/host | peak RSS MiB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        n = row["n"]
        lines.append(
            f"| {n} | {row['what']} | {row['wall']:.1f} | {row['wall'] / ping[n]['wall']:.2f} |"
            f" {1000 * row['wall'] / n:.0f} | {row['cpu']:.1f} | {1000 * row['cpu'] / n:.0f} | {row['rss_mib']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def write_section(table, label):
    """Put this run's table under HEADING, replacing the table of the same sub-heading (host counts)."""
    path = REPO / "docs" / "benchmarks.md"
    text = path.read_text(encoding="utf-8")
    start = text.find(HEADING)
    if start < 0:
        text = text.rstrip("\n") + f"\n\n{HEADING}\n\n"
        start = text.find(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    end = len(text) if end < 0 else end + 1
    section = text[start:end]
    sub = f"### {label}\n"
    if sub in section:
        s = section.index(sub)
        e = section.find("\n### ", s + len(sub))
        section = section[:s] + table.rstrip("\n") + "\n" + (section[e:] if e >= 0 else "")
    else:
        section = section.rstrip("\n") + "\n\n" + table
    path.write_text(text[:start] + section.rstrip("\n") + "\n" + ("\n" + text[end:] if end < len(text) else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="50,200", help="comma-separated host counts (1000 takes long)")
    parser.add_argument("--forks", type=int, default=20)
    parser.add_argument("--label", default="", help="a note on this run, printed after its command")
    parser.add_argument("--keep", action="store_true", help="keep the work directories and logs")
    parser.add_argument("--no-fact-cache", action="store_true", help="leave out the fact cache rows")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    sizes = [int(n) for n in args.hosts.split(",")]
    command = "python benchmarks/fleet_scale.py " + shlex.join(sys.argv[1:])
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
    rows = measure(sizes, args.forks, args.keep, fact_cache=not args.no_fact_cache)
    table = render(rows, heading(sizes), command, load_before, os.getloadavg(), started, args.label)
    print(table)
    if args.write:
        write_section(table, heading(sizes))


if __name__ == "__main__":
    main()
