#!/usr/bin/env python3
"""Print, as one JSON object, what the service preflight reads on the host, in one run.

Usage: service_probe.py SERVICE_USER LISTEN_ADDRESS PORT...
  listeners: one object per socket listening on a PORT: port, pid, comm and unit:
    "vllm" when it is one of our instances (the process runs in a vllm@ unit's
    cgroup, or, when its /proc entries are closed to us, as vLLM's hardened
    units make them, the socket belongs to SERVICE_USER), else "other". Reads
    /proc only (no ss or netstat).
  listen_ips: the addresses LISTEN_ADDRESS resolves to here (getent ahosts's
    lookup, getaddrinfo); [] when it does not resolve.
  shm_free_mib: free space in /dev/shm, in MiB rounded up (as df -B1M).
  cap_eff: the effective capabilities (hex) the probe, and so Ansible, runs with.
  cgroup2: whether /sys/fs/cgroup is the unified (v2) hierarchy.
One script instead of a task each: every remote run costs the controller more
than what it reads.
"""

import json
import os
import pwd
import socket
import sys
from pathlib import Path

LISTEN = "0A"


def listening_inodes(ports):
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == LISTEN and port in ports:
                found[fields[9]] = (port, int(fields[7]))
    return found


def owners(inodes):
    result = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                result.setdefault(target[8:-1], pid)
    return result


def describe(pid, uid, service_uid):
    if pid is not None:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
            return comm, "vllm" if "/vllm@" in cgroup else "other"
        except OSError:
            pass
    if uid == service_uid:
        return "a process of the service user", "vllm"
    return f"a process of uid {uid}", "other"


def listeners(service_user, ports):
    try:
        service_uid = pwd.getpwnam(service_user).pw_uid
    except KeyError:
        service_uid = None
    inodes = listening_inodes(ports)
    pids = owners(inodes)
    out = []
    for inode, (port, uid) in sorted(inodes.items(), key=lambda item: item[1]):
        pid = pids.get(inode)
        comm, unit = describe(pid, uid, service_uid)
        out.append({"port": port, "pid": int(pid) if pid else None, "comm": comm, "unit": unit})
    return out


def resolve(address):
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(info[4][0] for info in infos))


def shm_free_mib(path="/dev/shm"):
    try:
        stat = os.statvfs(path)
    except OSError:
        return 0
    return -(-stat.f_bavail * stat.f_frsize // (1024 * 1024))


def cap_eff():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return line.split()[1]
    return "0"


def main(args):
    print(
        json.dumps(
            {
                "listeners": listeners(args[0], {int(a) for a in args[2:]}),
                "listen_ips": resolve(args[1]),
                "shm_free_mib": shm_free_mib(),
                "cap_eff": cap_eff(),
                "cgroup2": os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
