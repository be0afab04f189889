#!/usr/bin/env python3
"""Print, as JSON, who listens on the TCP ports given as arguments.

Usage: listeners.py SERVICE_USER PORT...
One object per listening socket: port, pid, comm and unit: "vllm" when it is
one of our instances (the process runs in a vllm@ unit's cgroup, or, when its
/proc entries are closed to us, as vLLM's hardened units make them, the socket
belongs to SERVICE_USER), else "other". Reads /proc only (no ss or netstat).
"""

import json
import os
import pwd
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


def main(args):
    try:
        service_uid = pwd.getpwnam(args[0]).pw_uid
    except KeyError:
        service_uid = None
    ports = {int(a) for a in args[1:]}
    inodes = listening_inodes(ports)
    pids = owners(inodes)
    out = []
    for inode, (port, uid) in sorted(inodes.items(), key=lambda item: item[1]):
        pid = pids.get(inode)
        comm, unit = describe(pid, uid, service_uid)
        out.append({"port": port, "pid": int(pid) if pid else None, "comm": comm, "unit": unit})
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
