"""Keep HAProxy's server states (drain, maintenance, UP/DOWN) across reloads, restarts and reboots.

Installed by the loadbalancer role (vllm-cpu-fleet) and run by systemd from the drop-in
haproxy.service.d/server-state.conf, so every path HAProxy restarts through keeps them: the role's
handlers, `systemctl reload|restart haproxy` by a person, a package upgrade, a reboot.

  save --on-failure fail     ExecReload, after the configuration check and before the signal:
                             the new process loads what was live a moment before. A dump that
                             fails refuses the reload (the running process keeps its states).
  save --on-failure fail     also the rollout's, right after each drain, maintenance or re-enable it
                             sets through the admin socket (roles/loadbalancer/tasks/backend_state.yml):
                             the file always holds the last state the rollout set.
  save --on-failure keep     ExecStop: never blocks a stop; a dump that fails keeps the file as the
                             last save left it (a crashed or killed HAProxy restarts with no stop at
                             all, from that file too), so a drain the rollout set comes back with the
                             restart and a re-enable it saved is not undone by an older drain.
  fit                        ExecStartPre: the saved file against the configuration as it is now.
  reload                     ExecReload, last: signal the master and return once the new worker
                             alone answers the admin socket. HAProxy's reload is asynchronous:
                             without the wait, `systemctl reload` returns while the old worker
                             still answers, and a drain sent then is lost with that worker.

HAProxy's `load-server-state-from-file` matches the file's lines to servers by backend and server
name. It takes the operational and administrative state (drain, maint) from the file and, in 2.6
and 3.0, also the port (the address comes from the configuration), so a changed port in the
configuration would be replaced by the old one. Before the file is written, every line is fitted
to the configuration it will be loaded with:

- a server whose address, port or TLS (`ssl` on its line; HAProxy takes srv_use_ssl from the file too)
  changed keeps its administrative state (a drain or maintenance set through the admin socket stays)
  and gets the configuration's port and TLS; it starts DOWN and gets traffic once its health checks
  pass (what was UP was another endpoint);
- a server the configuration adds starts DOWN in the same way;
- a server the configuration no longer has is left out.

Only standard library; Python 3.6 or later.
"""

import argparse
import ipaddress
import os
import signal
import socket
import sys
import tempfile
import time

VERSION = "1"
PROG = "haproxy-server-state"
# srv_op_state 0: STOPPED (DOWN); health 0: the next `rise` checks decide; check status 1 (INI) and
# result 0: as a server whose checks have not run yet (status 0, UNKNOWN, crashed 2.6 and 3.0 workers).
DOWN = {"srv_op_state": "0", "srv_check_health": "0", "srv_check_status": "1", "srv_check_result": "0"}
# What HAProxy 2.6/3.0 write for a server with checks and nothing changed at run time.
NEW_SERVER = {
    "srv_op_state": "0",
    "srv_admin_state": "0",
    "srv_uweight": "1",
    "srv_iweight": "1",
    "srv_time_since_last_change": "0",
    "srv_check_status": "1",
    "srv_check_result": "0",
    "srv_check_health": "0",
    "srv_check_state": "6",
    "srv_agent_state": "0",
    "bk_f_forced_id": "0",
    "srv_f_forced_id": "0",
    "srv_fqdn": "-",
    "srvrecord": "-",
    "srv_use_ssl": "0",
    "srv_check_port": "0",
    "srv_check_addr": "-",
    "srv_agent_addr": "-",
    "srv_agent_port": "0",
}


class StateError(Exception):
    pass


def read(path):
    with open(path) as stream:
        return stream.read()


def say(message):
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def config_servers(text):
    """{(backend, server): (address, port or None, use_ssl "1" or "0")} of every `server` line of a backend or listen
    section."""
    servers, proxy = {}, None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        words = line.split()
        if not raw[0].isspace():
            proxy = words[1] if words[0] in ("backend", "listen") and len(words) > 1 else None
            continue
        if proxy is None or words[0] != "server" or len(words) < 3:
            continue
        address, port = words[2], None
        head, sep, tail = address.rpartition(":")
        if sep and tail.isdigit():
            address, port = head, tail
        servers[(proxy, words[1])] = (address.strip("[]"), port, "1" if "ssl" in words[3:] else "0")
    return servers


def parse_state(text):
    """(header fields, [line fields]) of a `show servers state` answer; refuses anything else."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or lines[0].strip() != VERSION or not lines[1].startswith("# be_id "):
        raise StateError(f"not a version {VERSION} server state (first line {lines[0][:60]!r})" if lines else "empty")
    header = lines[1][1:].split()
    rows = []
    for line in lines[2:]:
        fields = line.split()
        if len(fields) != len(header):
            raise StateError(f"a line has {len(fields)} fields, the header {len(header)}: {line[:80]!r}")
        rows.append(dict(zip(header, fields)))  # noqa: B905 - lengths checked above; strict= needs 3.10, EL 9 has 3.9
    return header, rows


def _is_ip(text):
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def fit(header, rows, servers):
    """The rows fitted to the configuration's servers (see the module's docstring), and what changed."""
    out, moved, seen, be_ids = [], [], set(), {}
    for row in rows:
        key = (row["be_name"], row["srv_name"])
        if key not in servers:
            continue
        seen.add(key)
        be_ids[row["be_name"]] = row["be_id"]
        address, port, use_ssl = servers[key]
        changed_address = _is_ip(address) and "srv_addr" in row and row["srv_addr"] != address
        changed_port = port is not None and "srv_port" in row and row["srv_port"] != port
        # HAProxy also takes srv_use_ssl from the file: TLS turned on or off in the configuration would be undone.
        changed_ssl = "srv_use_ssl" in row and row["srv_use_ssl"] != use_ssl
        if changed_address or changed_port or changed_ssl:
            row = dict(row, **DOWN)
            if changed_address:
                row["srv_addr"] = address
            if changed_port:
                row["srv_port"] = port
            if changed_ssl:
                row["srv_use_ssl"] = use_ssl
            moved.append(f"{key[0]}/{key[1]}")
        out.append(row)
    added = []
    for key, (address, port, use_ssl) in servers.items():
        if key in seen or port is None:
            continue
        row = dict(
            NEW_SERVER,
            srv_use_ssl=use_ssl,
            be_id=be_ids.get(key[0], "0"),
            be_name=key[0],
            srv_id="0",
            srv_name=key[1],
            srv_addr=address if _is_ip(address) else "0.0.0.0",
            srv_port=port,
        )
        out.append(row)
        added.append(f"{key[0]}/{key[1]}")
    return out, moved, added


def render(header, rows):
    lines = [VERSION, "# " + " ".join(header)]
    lines += [" ".join(row.get(name, "-") for name in header) for row in rows]
    return "\n".join(lines) + "\n"


def write_atomically(path, text):
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(prefix=".server-state.", dir=directory)
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def ask(socket_path, timeout, command="show servers state"):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(socket_path)
        conn.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def summary(rows):
    drained = sum(1 for row in rows if int(row.get("srv_admin_state", "0")) & 0x08)
    maint = sum(1 for row in rows if int(row.get("srv_admin_state", "0")) & 0x01)
    return f"{len(rows)} servers ({drained} drained, {maint} in maintenance)"


def put_aside(state):
    if os.path.exists(state):
        os.replace(state, state + ".stale")
        return f"; the older {state} is not restored (kept as {state}.stale)"
    return ""


def save(args):
    servers = config_servers(read(args.config))
    if not os.path.exists(args.socket):
        if args.on_failure == "keep" and os.path.exists(args.state):
            say(f"no admin socket at {args.socket}: {args.state} is kept as its last save wrote it.")
            return 0
        # No admin socket at this path: nothing was drained through it, so nothing is kept.
        say(f"no admin socket at {args.socket}: no server state to keep{put_aside(args.state)}.")
        return 0
    try:
        header, rows = parse_state(ask(args.socket, args.timeout))
    except (OSError, StateError) as error:
        if args.on_failure == "fail":
            say(
                f"the admin socket {args.socket} did not answer `show servers state` ({error}), so the servers'"
                " drain and maintenance states cannot be carried over: the reload is refused and HAProxy keeps"
                " running as it is. Fix: look at `journalctl -u haproxy`; `systemctl restart haproxy` starts it"
                " again without the saved states (drained servers come back in service)."
            )
            return 1
        if os.path.exists(args.state):
            say(
                f"the admin socket {args.socket} did not answer `show servers state` ({error}); {args.state} is"
                " kept as its last save wrote it (the rollout saves after every state it sets)."
            )
        else:
            say(
                f"the admin socket {args.socket} did not answer `show servers state` ({error}) and there is no"
                f" {args.state}: the servers start as the configuration says."
            )
        return 0
    rows, moved, added = fit(header, rows, servers)
    write_atomically(args.state, render(header, rows))
    if os.path.exists(args.state + ".stale"):
        os.unlink(args.state + ".stale")
    say(f"saved {summary(rows)} to {args.state}" + notes(moved, added))
    return 0


def notes(moved, added):
    text = ""
    if moved:
        text += f"; address, port or TLS changed, DOWN until checked: {', '.join(moved)}"
    if added:
        text += f"; new, DOWN until checked: {', '.join(added)}"
    return text


def fit_file(args):
    if not os.path.exists(args.state):
        return 0
    try:
        header, rows = parse_state(read(args.state))
    except (OSError, StateError) as error:
        say(f"{args.state}: {error}{put_aside(args.state)}.")
        return 0
    rows, moved, added = fit(header, rows, config_servers(read(args.config)))
    write_atomically(args.state, render(header, rows))
    say(f"{args.state}: restoring {summary(rows)}" + notes(moved, added))
    return 0


def worker_pid(socket_path, timeout):
    """The pid of the worker that answers the admin socket, or None when none answers."""
    try:
        answer = ask(socket_path, timeout, "show info")
    except OSError:
        return None
    for line in answer.splitlines():
        if line.startswith("Pid:"):
            return int(line.split(":", 1)[1])
    return None


def reload(args):
    old = worker_pid(args.socket, 1.0)
    os.kill(args.master_pid, signal.SIGUSR2)
    if old is None:
        say(f"no worker answers {args.socket}: the master is signalled without waiting for the new worker.")
        return 0
    # Until the new worker is ready, old and new share the socket; the old one stops accepting then.
    deadline, in_a_row = time.monotonic() + args.timeout, 0
    while time.monotonic() < deadline:
        pid = worker_pid(args.socket, 1.0)
        in_a_row = in_a_row + 1 if pid not in (None, old) else 0
        if in_a_row == args.answers:
            return 0
        time.sleep(0.05)
    say(
        f"the new worker did not take over {args.socket} from worker {old} within {args.timeout:g} s: the reload"
        " is not known to be applied. Fix: look at `journalctl -u haproxy`; the configuration was checked"
        " before the signal, so a worker that failed to start says why there."
    )
    return 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n", maxsplit=1)[0])
    commands = parser.add_subparsers(dest="command")
    commands.required = True
    for name in ("save", "fit"):
        command = commands.add_parser(name)
        command.add_argument("--config", required=True, help="HAProxy's configuration file")
        command.add_argument("--state", required=True, help="the server-state-file HAProxy loads")
        if name == "save":
            command.add_argument("--socket", required=True, help="HAProxy's admin socket")
            command.add_argument("--on-failure", choices=("fail", "keep"), required=True)
            command.add_argument("--timeout", type=float, default=10.0)
    command = commands.add_parser("reload")
    command.add_argument("--socket", required=True, help="HAProxy's admin socket")
    command.add_argument("--master-pid", type=int, required=True, help="the master's pid ($MAINPID)")
    command.add_argument("--timeout", type=float, default=30.0)
    command.add_argument("--answers", type=int, default=10, help="answers in a row from a new worker")
    args = parser.parse_args(argv)
    return {"save": save, "fit": fit_file, "reload": reload}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
