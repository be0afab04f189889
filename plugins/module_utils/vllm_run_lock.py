"""The run lock: one run of site.yml or upgrade.yml changes a host at a time (review day2-edges, finding 7).

Without it, a second run read a host's rollout record while the first run was in that host's health gate,
"recovered" it (restarting every instance under the first run) and deleted the first run's snapshot, whose
rollback then did nothing. Each host of a run holds a small JSON file naming the run that changes it: its id,
owner, the controller and the ansible-playbook process, the playbook, when it started and until when its lease
runs. A run takes the lock on every host before it changes any (playbooks/run_lock.yml), and on every load balancer
its rollout drains on, even one --limit leaves out (by delegation: two runs limited to different hosts would drain
them at once, review day2-fleet-shape N2), and gives it back after its last play (playbooks/run_unlock.yml). A run
that cannot take every lock gives back the locks it took (never another run's); a run that stopped later keeps it.

Another run's lock is taken over only when that run is proven over: its ansible-playbook process, on this same
controller (same machine id and pid namespace: containers built from one image share a machine id) no longer
exists (a pid reused by another process has another start time; after a reboot, the boot id differs), or the
operator names its id (vllm_fleet_break_lock). An ended lease alone proves nothing (a run from another controller
may be slow, or the clocks differ); it only changes the message.

The file is read, decided on and written under an exclusive flock, so two runs taking the same host at once
are serialised; a free lock is an empty file (a removed file could be written by a process that opened it
before the removal).
"""

import calendar
import fcntl
import json
import os
import time


class LockError(Exception):
    """The lock file cannot be read or written; the message names the path."""


def holder_text(holder):
    """One line naming a holder for an operator."""
    return (
        f"run {holder.get('run_id')} ({holder.get('owner')}, ansible-playbook pid {holder.get('pid')} on "
        f"{holder.get('controller')}, {holder.get('playbook')}) since {holder.get('started')}"
    )


STAMP = "%Y-%m-%dT%H:%M:%SZ"


def _stamp(seconds):
    return time.strftime(STAMP, time.gmtime(seconds))


def _parse_stamp(text):
    try:
        return calendar.timegm(time.strptime(str(text), STAMP))
    except ValueError:
        return None


def decide(current, me, now, break_run_id="", holder_alive=None):
    """What this run does with a host's lock.

    current: the holder on the host ({} when free); me: this run's holder; now: seconds since the epoch;
    holder_alive: whether the holder's process still runs (None: it cannot be told, another controller).
    Returns (verdict, message): verdict is 'take' (free, or ours: renewed), 'take_over' (another run, proven
    over) or 'refuse'.
    """
    if not current or current.get("run_id") == me["run_id"]:
        return "take", ""
    who = holder_text(current)
    if break_run_id and break_run_id == current.get("run_id"):
        return "take_over", f"taking over the run lock of {who}: vllm_fleet_break_lock names it"
    if holder_alive is False:
        return "take_over", f"taking over the run lock of {who}: that ansible-playbook process has ended"
    lease = _parse_stamp(current.get("lease_until"))
    ended = lease is not None and lease < now
    if holder_alive is None and ended:
        state = (
            f"its lease ended at {current.get('lease_until')}, so that run is probably over, but it ran on another "
            "controller"
        )
    elif holder_alive is None:
        state = f"it ran on another controller and its lease runs until {current.get('lease_until')}"
    else:
        state = "its ansible-playbook process is still running on this controller"
    return "refuse", (
        f"the run lock is held by {who}; {state}. Another run is changing this host: nothing was changed by this "
        f"run. Fix: wait for that run to end; if it is over (no ansible-playbook of it runs anywhere), run again "
        f"with -e vllm_fleet_break_lock={current.get('run_id')}"
    )


def read(handle, path):
    handle.seek(0)
    text = handle.read()
    if not text.strip():
        return {}
    try:
        current = json.loads(text)
    except ValueError as err:
        raise LockError(f"{path}: not a run lock ({err}); fix: remove it if no run is changing this host") from err
    if not isinstance(current, dict) or not current.get("run_id"):
        raise LockError(f"{path}: not a run lock (no run_id); fix: remove it if no run is changing this host")
    return current


def _write(handle, holder):
    handle.seek(0)
    handle.truncate()
    if holder:
        handle.write(json.dumps(holder, sort_keys=True) + "\n")
    handle.flush()
    os.fsync(handle.fileno())


def _open(path, check_mode):
    directory = os.path.dirname(path)
    try:
        if check_mode and not os.path.exists(path):
            return None
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o755)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as err:
        raise LockError(
            f"{path}: cannot open the run lock: {err.strerror}; fix: let the connection user write there, or set"
            " vllm_fleet_run_lock to a file it can write"
        ) from err
    handle = os.fdopen(fd, "r+", encoding="utf-8")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def acquire(path, me, replace="", check_mode=False):
    """Take the lock for me when it is free or ours, or when its holder's run_id is `replace` (a compare and swap:
    the holder judged over may have been replaced meanwhile). Returns {acquired, changed, holder}: holder is the
    lock's holder afterwards (the other run's when not acquired)."""
    handle = _open(path, check_mode)
    if handle is None:
        return {"acquired": True, "changed": True, "holder": me}
    with handle:
        current = read(handle, path)
        mine = not current or current.get("run_id") == me["run_id"]
        if not mine and not (replace and current.get("run_id") == replace):
            return {"acquired": False, "changed": False, "holder": current}
        changed = current != me
        if changed and not check_mode:
            _write(handle, me)
        return {"acquired": True, "changed": changed, "holder": me, "replaced": {} if mine else current}


def release(path, run_id, check_mode=False):
    """Give the lock back when this run holds it; another run's lock stays."""
    if not os.path.exists(path):
        return {"released": False, "changed": False, "holder": {}}
    handle = _open(path, check_mode)
    with handle:
        current = read(handle, path)
        if current.get("run_id") != run_id:
            return {"released": False, "changed": False, "holder": current}
        if not check_mode:
            _write(handle, {})
        return {"released": True, "changed": True, "holder": {}}


def new_holder(run_id, owner, controller, identity, pid, pid_start, playbook, started, now, lease_seconds):
    """identity: the controller's machine_id, boot_id and pid_ns (see the action plugin)."""
    return {
        "run_id": run_id,
        "owner": owner,
        "controller": controller,
        **identity,
        "pid": pid,
        "pid_start": pid_start,
        "playbook": playbook,
        "started": _stamp(started),
        "lease_until": _stamp(now + lease_seconds),
    }
