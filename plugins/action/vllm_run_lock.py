"""Action plugin vllm.cpu_fleet.vllm_run_lock (documented in plugins/modules/vllm_run_lock.py).

On the controller: this run's identity (the ansible-playbook process that forked this worker) and whether another
run's lock may be taken over; on the host, the module takes, renews or gives back the lock under a flock.
"""

import getpass
import os
import socket
import subprocess
import time
from pathlib import Path

from ansible import context
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_run_lock import decide, holder_text, new_holder

display = Display()
MODULE = "vllm.cpu_fleet.vllm_run_lock"


def _first(*paths, read=lambda p: Path(p).read_text(encoding="ascii").strip()):
    for path in paths:
        try:
            text = read(path)
        except OSError:
            continue
        if text:
            return text
    return ""


def controller_identity():
    """What tells this controller's processes from others': the machine id, and the pid namespace (containers
    from one image share a machine id, not a pid namespace); the boot id tells a process of an earlier boot."""
    return {
        "machine_id": _first("/etc/machine-id", "/var/lib/dbus/machine-id") or socket.gethostname(),
        "pid_ns": _first("/proc/self/ns/pid", read=os.readlink),
        "boot_id": _first("/proc/sys/kernel/random/boot_id"),
    }


def process_start(pid):
    """The process's start, as a string that differs for a reused pid; None when no such process runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        return stat.rsplit(")", 1)[1].split()[19]  # field 22, starttime in clock ticks since boot
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        pass
    try:
        done = subprocess.run(
            ["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return None
    return done.stdout.strip() or None


def _started(pid):
    try:
        ticks = int(process_start(pid))
        stat = Path("/proc/stat").read_text().splitlines()
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (TypeError, ValueError, OSError, StopIteration):
        return time.time()


def this_run(lease):
    """This run's holder record: every worker of one ansible-playbook process computes the same run id."""
    pid = os.getppid()
    started = _started(pid)
    controller = socket.gethostname()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    playbooks = context.CLIARGS.get("args") or ()
    return new_holder(
        run_id=f"{stamp}-{controller}-{pid}",
        owner=f"{getpass.getuser()}@{controller}",
        controller=controller,
        identity=controller_identity(),
        pid=pid,
        pid_start=process_start(pid),
        playbook=" ".join(os.path.basename(p) for p in playbooks) or "ansible",
        started=started,
        now=time.time(),
        lease_seconds=lease,
    )


def holder_alive(holder):
    """Whether the holder's ansible-playbook still runs: None when it ran on another controller."""
    here = controller_identity()
    if (holder.get("machine_id"), holder.get("pid_ns")) != (here["machine_id"], here["pid_ns"]):
        return None
    if holder.get("boot_id") != here["boot_id"]:
        return False
    start = process_start(holder.get("pid"))
    return start is not None and start == holder.get("pid_start")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("path", "state", "lease", "break_lock"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        # The host whose lock this is: the load balancer a task delegates to (run_lock.yml locks those --limit
        # leaves out), else the task's host.
        host = self._task.delegate_to or task_vars.get("inventory_hostname")
        try:
            lease = int(args.get("lease", 21600))
        except (TypeError, ValueError):
            lease = -1
        if lease < 1:
            return dict(result, failed=True, msg=(
                f"{host}: vllm_fleet_run_lock_lease: {args.get('lease')!r} is not a"
                " number of seconds above 0; fix: set it to one, such as 21600 (6 hours)"))  # fmt: skip
        args["lease"] = lease
        me = this_run(lease)
        args["holder"] = me
        breaking = str(args.get("break_lock") or "")
        out = self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
        if out.get("failed"):
            return {**result, **out, "msg": f"{host}: vllm_fleet_run_lock: {out.get('msg')}"}
        if args.get("state", "acquire") != "acquire" or out.get("acquired"):
            return dict(result, **out)
        current = out.get("holder") or {}
        verdict, message = decide(current, me, time.time(), breaking, holder_alive(current))
        if verdict == "take_over":
            out = self._execute_module(
                module_name=MODULE, module_args=dict(args, replace=current["run_id"]), task_vars=task_vars
            )
            if out.get("acquired"):
                display.warning(f"{host}: {message}")
                return {**result, **out, "msg": message}
            message = (
                f"the run lock changed hands while this run took it over: it is held by "
                f"{holder_text(out.get('holder') or {})} now; nothing was changed by this run. Fix: run again"
            )
        return {**result, **out, "msg": f"{host}: {message}"}
