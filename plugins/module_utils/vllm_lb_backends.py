"""What the load balancer forwards to now, and whether a run may take that many servers away.

A run whose inventory holds only part of the fleet (an AWX / Automation Platform job slice, or an
inventory someone cut by hand) plans only its own vLLM hosts; writing HAProxy's backend from that
plan would take every other host out of service. The configured backend is the one record of the
whole fleet the load balancer has, so preflight compares the planned servers with it.

The admin socket's answers (`show stat` CSV, `show servers state`) are read by their `# ` header
line, not by column number: HAProxy adds columns between versions.
"""

import csv
import ipaddress
import re

_SECTION = re.compile(
    r"^(global|defaults|frontend|backend|listen|resolvers|peers|userlist|program|cache|mailers|ring|http-errors)\b"
)
_SERVER = re.compile(r"^\s+server\s+(\S+)")
_SERVER_NAME = re.compile(r"(.+)-(vllm-[0-9]+)")


class BackendError(ValueError):
    """A bad input, worded `<variable>: <problem>; fix: <fix>`."""


def _server_lines(config_text, backend):
    """The words of each `server` line of section `backend <backend>` in an HAProxy configuration, in order."""
    inside = False
    for line in (config_text or "").splitlines():
        if _SECTION.match(line):
            words = line.split()
            inside = words[0] == "backend" and len(words) > 1 and words[1] == backend
            continue
        if inside and _SERVER.match(line):
            yield line.split()


def configured_servers(config_text, backend):
    """Names of the `server` lines of section `backend <backend>` in an HAProxy configuration, in order."""
    return [words[1] for words in _server_lines(config_text, backend)]


def configured_endpoints(config_text, backend):
    """{server: endpoint} of the `server` lines of section `backend <backend>`: 'address:port', or
    'https://address:port' for a server line with `ssl` (TLS to the instance)."""
    return {
        words[1]: ("https://" if "ssl" in words[3:] else "") + words[2]
        for words in _server_lines(config_text, backend)
        if len(words) > 2
    }


def endpoint(server):
    """The endpoint of a planned server ({'address', 'port', 'tls'}): 'address:port', or 'https://address:port' when
    its instances serve TLS."""
    return ("https://" if server.get("tls") else "") + f"{server['address']}:{server['port']}"


def split_endpoint(text):
    """('address', port, tls) of an endpoint (an IPv6 address has colons of its own: the port is after the last)."""
    text = str(text)
    tls = text.startswith("https://")
    address, _sep, port = text[len("https://") if tls else 0 :].rpartition(":")
    return address.strip("[]"), int(port), tls


def server_line(server, ca_file):
    """What follows a server's name on its `server` line: its endpoint, and for TLS the verification of the
    instance's certificate against the fleet's CA (ca_file) and, when the server's host is a name, that name
    (verifyhost: HAProxy checks a certificate's DNS names, not its IP addresses)."""
    line = f"{server['address']}:{server['port']}"
    if not server.get("tls"):
        return line
    line += f" ssl verify required ca-file {ca_file}"
    host = str(server.get("host", ""))
    return line + (f" verifyhost {host}" if host and not _is_ip(host) else "")


def backend_servers(plans, address_of, tls_of=None):
    """Every planned server of the backend, in inventory order: {'name': '<host>-<instance>', 'host', 'address',
    'port', 'tls'}. plans: [(host, vllm_plan)], address_of: {host: the address the load balancers use for it},
    tls_of: {host: whether its instances serve TLS}. The one place the servers' names and endpoints are made (the
    load balancer's configuration and the rollout's switch)."""
    return [
        {
            "name": f"{host}-{instance.get('name', '')}",
            "host": host,
            "address": str(address_of.get(host, host)),
            "port": int(instance.get("port") or 0),
            "tls": bool((tls_of or {}).get(host)),
        }
        for host, plan in plans
        for instance in (plan or {}).get("instances", [])
    ]


def server_owner(name, hosts):
    """The host of `hosts` whose server `name` is, or None. A server is named `<host>-<instance>` and the planner
    names instances `vllm-<index>` (vllm_cpu_planner.py), so the host is what is left before the last `-vllm-<n>`:
    `web-2-vllm-0` is host `web-2`'s, never host `web`'s, whichever of them this run holds."""
    match = _SERVER_NAME.fullmatch(str(name))
    return match.group(1) if match and match.group(1) in set(hosts) else None


def host_servers(names, host):
    """The server names of `names` that are `host`'s: the planned ones and those its plan dropped alike (a server
    the plan dropped is still the host's on the load balancer until its rollout removes it)."""
    return [name for name in names if server_owner(name, [host]) == host]


def capacity_problems(views, leaving, minimum):
    """The load balancers on which fewer than `minimum` servers would stay UP and ready while the hosts in
    `leaving` (this batch's hosts whose change drains them) are drained: one problem per such load balancer,
    [] when each keeps enough. `views` is {load balancer: {server: {'admin', 'up'}}} (server_states()). A server
    counts when HAProxy sees it UP and its administrative state is ready (not drain, not maint) and it is not one
    of a leaving host's; servers already DOWN or drained elsewhere count for nothing, as in a disruption budget."""
    leaving = sorted(set(leaving))
    problems = []
    for lb in sorted(views):
        states = views[lb] or {}
        going = set()
        for host in leaving:
            going.update(host_servers(states, host))
        serving = {name for name, s in states.items() if s.get("up") and s.get("admin") == "ready"}
        stay = sorted(serving - going)
        if len(stay) >= minimum:
            continue
        down = sorted(set(states) - serving - going)
        problems.append(
            f"{lb}: {len(stay)} of {len(states)} servers would stay UP and ready while {', '.join(leaving)} drain"
            f" ({len(going)} of theirs); rollout_min_available is {minimum}"
            + (f"; not UP and ready already: {', '.join(down)}" if down else "")
        )
    return problems


def retired_servers(names, host, planned):
    """The servers of `names` (configured or live on a load balancer) that are `host`'s but not in `planned` (the
    names of its planned servers): the rollout drains them with the host and removes them after its gate."""
    planned = set(planned)
    return [name for name in host_servers(names, host) if name not in planned]


def held_servers(servers, config_text, backend, hosts=()):
    """The servers as the load balancer play writes them: a server the configuration has already keeps the
    endpoint it has there, so that a changed port or address never reaches HAProxy for every host at once; the
    rollout moves each host's servers inside that host's drained window (endpoint_changes). A configured server
    that the plans dropped and whose host is in `hosts` (the backend hosts of this run) stays too, after its host's
    planned servers: its instance still serves until that host's drained window, and the rollout removes it after
    the host's gate (retired_servers). Each server gains 'planned' (its planned endpoint, None for a dropped one),
    'held' (whether the written endpoint differs from it) and 'retired' (dropped by the plan)."""
    configured = configured_endpoints(config_text, backend)
    planned_names = {server["name"] for server in servers}
    dropped = {}
    for name in configured:
        owner = server_owner(name, hosts) if name not in planned_names else None
        if owner is not None:
            dropped.setdefault(owner, []).append(name)

    def kept(host):
        for name in dropped.pop(host, []):
            address, port, tls = split_endpoint(configured[name])
            yield {"name": name, "host": host, "address": address, "port": port, "tls": tls, "planned": None,
                   "held": True, "retired": True}  # fmt: skip

    out = []
    for index, server in enumerate(servers):
        planned = endpoint(server)
        written = configured.get(server["name"], planned)
        address, port, tls = split_endpoint(written)
        out.append(
            dict(server, address=address, port=port, tls=tls, planned=planned, held=written != planned, retired=False)
        )
        if index + 1 == len(servers) or servers[index + 1]["host"] != server["host"]:
            out.extend(kept(server["host"]))
    for host in list(dropped):
        out.extend(kept(host))
    return out


def endpoint_changes(config_text, backend, servers, wanted=None):
    """[{'name', 'host', 'from', 'to', 'address', 'port', 'tls', 'runtime'}] for the servers whose configured
    endpoint is not the wanted one: wanted is {server: endpoint} (a rollback's endpoints from before), else each
    server's planned endpoint. Servers the configuration does not have yet are left to the load balancer play. Only a
    move to another IP address with the same TLS is made at run time (runtime); the rest needs a reload."""
    configured = configured_endpoints(config_text, backend)
    changes = []
    for server in servers:
        name = server["name"]
        target = (wanted or {}).get(name) if wanted is not None else endpoint(server)
        if name not in configured or not target or configured[name] == target:
            continue
        address, port, tls = split_endpoint(target)
        changes.append(
            {"name": name, "host": server.get("host", ""), "from": configured[name], "to": target, "address": address,
             "port": port, "tls": tls, "runtime": _is_ip(address) and tls == split_endpoint(configured[name])[2]}
        )  # fmt: skip
    return changes


def _is_ip(text):
    """HAProxy's runtime API moves a server to an IP address only (a name needs a reload)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def removal_limit(max_removed_percent, configured):
    """How many of `configured` servers one run may remove: the percentage's share, never fewer than one."""
    try:
        percent = int(str(max_removed_percent).strip().rstrip("%"))
    except ValueError:
        percent = -1
    if not 0 <= percent <= 100:
        raise BackendError(
            f"loadbalancer_max_removed_servers_percent: {max_removed_percent!r} is not a percentage from 0 to 100; "
            "fix: give a whole number such as 25 (100 lets a run remove every server)"
        )
    return max(1, configured * percent // 100)


def removal_check(config_text, backend, planned, max_removed_percent, group="vllm_hosts", hosts=()):
    """{'removed': servers configured now but not planned, 'problem': '' or why the run must stop}. A server of a
    host in `hosts` (the backend hosts of this run) is not removed by the load balancer play (held_servers keeps
    it until its host's rollout), so it is not counted."""
    configured = configured_servers(config_text, backend)
    planned = set(planned)
    removed = [name for name in configured if name not in planned and server_owner(name, hosts) is None]
    limit = removal_limit(max_removed_percent, len(configured))
    problem = ""
    if len(removed) > limit:
        problem = (
            f"loadbalancer_backend_group: this run would take {len(removed)} of the {len(configured)} servers HAProxy "
            f"forwards to now out of backend '{backend}' ({', '.join(removed)}), more than "
            f"loadbalancer_max_removed_servers_percent ({max_removed_percent}%) allows. A run whose inventory holds "
            f"only part of group '{group}' (an AWX job slice, a cut inventory) plans only its own hosts; fix: run the "
            "load balancer play with every vLLM host in the inventory (unsliced), or, to retire these hosts on "
            "purpose, -e loadbalancer_max_removed_servers_percent=100"
        )
    return {"removed": removed, "problem": problem}


# srv_admin_state is a bit field (HAProxy's enum srv_admin): forced maintenance, forced drain.
_ADMIN_FORCED_MAINT = 0x01
_ADMIN_FORCED_DRAIN = 0x08
# srv_op_state 2: SRV_ST_RUNNING (UP).
_OP_RUNNING = "2"


def _rows(text, command, split, required):
    """The rows of one admin socket answer as dicts keyed by its `# ` header; lines before the header
    (`show servers state` starts with its format version) are skipped."""
    header, rows = None, []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            header = [name.strip() for name in split(line[1:])]
            continue
        if header is not None:
            # A short row lacks the last columns; the check below names a required one it lacks.
            rows.append(dict(zip(header, split(line), strict=False)))
    if header is None:
        raise BackendError(
            f"loadbalancer_admin_socket: HAProxy's answer to '{command}' has no '# ' header line "
            f"({(text or '').strip()[:120]!r}); fix: check that the socket is HAProxy's admin socket (level admin) "
            "and that the backend exists (loadbalancer_backend_name)"
        )
    missing = [name for name in required if name not in header]
    short = next((row for row in rows if any(name not in row for name in required)), None)
    if missing or short:
        where = f"in its header ({','.join(header)})" if missing else f"in the row {short!r}"
        raise BackendError(
            f"loadbalancer_admin_socket: HAProxy's answer to '{command}' lacks "
            f"{', '.join(missing or [name for name in required if name not in short])} {where}; "
            "fix: point loadbalancer_admin_socket at HAProxy's admin socket; if it is that, this HAProxy "
            f"names the columns differently: the role needs {', '.join(required)}"
        )
    return rows


def _csv_fields(line):
    return next(csv.reader([line]))


def stat_rows(text):
    """`show stat` CSV rows as dicts by its header; pxname, svname and scur must be there."""
    return _rows(text, "show stat", _csv_fields, ("pxname", "svname", "scur"))


def servers_state_rows(text):
    """`show servers state` rows as dicts by its header; srv_name, srv_op_state and srv_admin_state must be there."""
    return _rows(text, "show servers state", str.split, ("srv_name", "srv_op_state", "srv_admin_state"))


def server_states(text):
    """{server: {'admin': 'maint' | 'drain' | 'ready', 'up': bool}} from a `show servers state` answer."""
    states = {}
    for row in servers_state_rows(text):
        try:
            admin = int(row["srv_admin_state"])
        except ValueError:
            raise BackendError(
                f"loadbalancer_admin_socket: srv_admin_state of {row['srv_name']} is {row['srv_admin_state']!r}, "
                "not a number; fix: check the socket is HAProxy's admin socket"
            ) from None
        states[row["srv_name"]] = {
            "admin": "maint" if admin & _ADMIN_FORCED_MAINT else "drain" if admin & _ADMIN_FORCED_DRAIN else "ready",
            "up": row["srv_op_state"] == _OP_RUNNING,
        }
    return states


def in_flight(text, servers):
    """{server: requests in flight (scur)} from a `show stat` answer, for the servers named (rows of other
    proxies and the BACKEND/FRONTEND summary lines are left out)."""
    wanted = set(servers)
    counts = {}
    for row in stat_rows(text):
        if row["svname"] in wanted:
            try:
                counts[row["svname"]] = int(row["scur"] or 0)
            except ValueError:
                raise BackendError(
                    f"loadbalancer_admin_socket: scur of {row['svname']} is {row['scur']!r}, not a number; "
                    "fix: check the socket is HAProxy's admin socket"
                ) from None
    return counts
