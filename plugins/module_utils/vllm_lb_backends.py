"""What the load balancer forwards to now, and whether a run may take that many servers away.

A run whose inventory holds only part of the fleet (an AWX / Automation Platform job slice, or an
inventory someone cut by hand) plans only its own vLLM hosts; writing HAProxy's backend from that
plan would take every other host out of service. The configured backend is the one record of the
whole fleet the load balancer has, so preflight compares the planned servers with it.
"""

import re

_SECTION = re.compile(
    r"^(global|defaults|frontend|backend|listen|resolvers|peers|userlist|program|cache|mailers|ring|http-errors)\b"
)
_SERVER = re.compile(r"^\s+server\s+(\S+)")


class BackendError(ValueError):
    """A bad input, worded `<variable>: <problem>; fix: <fix>`."""


def configured_servers(config_text, backend):
    """Names of the `server` lines of section `backend <backend>` in an HAProxy configuration, in order."""
    servers, inside = [], False
    for line in (config_text or "").splitlines():
        section = _SECTION.match(line)
        if section:
            words = line.split()
            inside = words[0] == "backend" and len(words) > 1 and words[1] == backend
            continue
        server = _SERVER.match(line) if inside else None
        if server:
            servers.append(server.group(1))
    return servers


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


def removal_check(config_text, backend, planned, max_removed_percent, group="vllm_hosts"):
    """{'removed': servers configured now but not planned, 'problem': '' or why the run must stop}."""
    configured = configured_servers(config_text, backend)
    planned = set(planned)
    removed = [name for name in configured if name not in planned]
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
