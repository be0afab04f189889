"""Whether this host reaches a list of address:port pairs (stdlib only, read-only): the monitoring host's preflight.

A connection that is made, or refused, reached the target's host: nothing listens there yet (a new fleet: the
exporters and instances start later in the run), or its firewall resets the connection until this run admits the
monitoring host; either is fine. A connection that times out, a host or network without a route, and a name that
does not resolve are problems: the path from this host to the target is closed, and the scrapes would fail.
"""

import errno
import socket
from concurrent.futures import ThreadPoolExecutor

CONNECTED, REFUSED, UNREACHABLE = "connected", "refused", "unreachable"
# Connections tried at once: each waits at most the timeout, so a fleet of hundreds of targets takes seconds.
WORKERS = 32
_REASONS = {
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "the network is unreachable",
    errno.EHOSTDOWN: "the host is down",
}


def connect(address, port, timeout):
    """(state, reason) of one TCP connection from here to address:port, waiting at most timeout seconds."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return CONNECTED, ""
    except ConnectionRefusedError:
        return REFUSED, "connection refused"
    except socket.gaierror as err:
        return UNREACHABLE, f"the name does not resolve: {err.strerror or err}"
    except TimeoutError:
        return UNREACHABLE, f"timed out after {timeout:g} s"
    except OSError as err:
        return UNREACHABLE, _REASONS.get(err.errno) or err.strerror or str(err)


def reach(targets, timeout, workers=WORKERS):
    """Each target ({name, address, port}) with its state and reason, in the order given; each address:port is
    tried once, all of them at once."""
    pairs = list(dict.fromkeys((str(target["address"]), int(target["port"])) for target in targets))
    if not pairs:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(pairs))) as pool:
        answers = dict(zip(pairs, pool.map(lambda pair: connect(pair[0], pair[1], timeout), pairs), strict=True))
    results = []
    for target in targets:
        state, reason = answers[(str(target["address"]), int(target["port"]))]
        results.append(dict(target, port=int(target["port"]), state=state, reason=reason))
    return results


def problems(source, results):
    """One message per target this host (inventory name source) cannot reach, naming the fix."""
    found = []
    for result in results:
        if result["state"] != UNREACHABLE:
            continue
        name, address = str(result["name"]), str(result["address"])
        shown = name if address == name else f"{name} ({address})"
        found.append(
            f"{source}: monitoring: cannot reach {shown} port {result['port']} from the monitoring host"
            f" ({result['reason']}); fix: open the network path from {source} to that port, or set"
            " monitoring_target_address_var to an address it can reach."
        )
    return found
