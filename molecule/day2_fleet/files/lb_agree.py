"""Print, as JSON, one load balancer's servers of a backend as haproxy.cfg has them and as HAProxy runs them.

Usage: lb_agree.py CONFIG SOCKET BACKEND. Each side is {server: {"endpoint": "addr:port", "tls": bool}}; the
running side adds the admin state (ready, drain, maint) and whether the server is UP. The file is what every
later reload serves, the running state what serves now: after a batch they must agree, or a reload days later
changes the fleet (issue 41 item 1).
"""

import json
import socket
import sys

CONFIG, SOCKET, BACKEND = sys.argv[1:4]
ADMIN = {0: "ready", 1: "maint", 8: "drain"}


def configured():
    servers, inside = {}, False
    with open(CONFIG, encoding="utf-8") as handle:
        for line in handle:
            head = line.split()
            if not head or head[0].startswith("#"):
                continue
            if not line[0].isspace():
                inside = head[:2] == ["backend", BACKEND]
                continue
            if inside and head[0] == "server" and len(head) >= 3:
                servers[head[1]] = {"endpoint": head[2], "tls": "ssl" in head[3:]}
    return servers


def admin(command):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(SOCKET)
        conn.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return b"".join(chunks).decode()
            chunks.append(chunk)


def running():
    out, columns = {}, []
    for line in admin(f"show servers state {BACKEND}").splitlines():
        if line.startswith("# be_id"):
            columns = line[2:].split()
            continue
        words = line.split()
        if not columns or len(words) < len(columns):
            continue
        row = dict(zip(columns, words, strict=False))
        out[row["srv_name"]] = {
            "endpoint": f"{row['srv_addr']}:{row['srv_port']}",
            "admin": ADMIN.get(int(row["srv_admin_state"]) & 0x29, row["srv_admin_state"]),
            "up": row["srv_op_state"] == "2",
        }
    return out


print(json.dumps({"config": configured(), "running": running()}, sort_keys=True))
