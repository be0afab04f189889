"""Thin Jinja2 filters over the load balancer's backend guard and HAProxy's admin socket answers
(module_utils/vllm_lb_backends.py)."""

from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_lb_backends import (
    BackendError,
    backend_servers,
    capacity_problems,
    endpoint_changes,
    held_servers,
    host_servers,
    in_flight,
    removal_check,
    retired_servers,
    server_line,
    server_states,
)


def _named(err, host):
    return AnsibleFilterError(f"{host}: {err}" if host else str(err))


def vllm_lb_removal_check(
    config_text, backend, planned, max_removed_percent, group="vllm_hosts", host=None, hosts=None
):
    """The servers this run would remove from the configured backend, and the problem if they are too many."""
    try:
        result = removal_check(config_text, backend, planned, max_removed_percent, group, hosts or ())
    except BackendError as err:
        raise _named(err, host) from err
    if result["problem"] and host:
        result["problem"] = f"{host}: {result['problem']}"
    return result


def vllm_lb_server_states(servers_state_text, host=None):
    """{server: {'admin': 'maint' | 'drain' | 'ready', 'up': bool}} from `show servers state`."""
    try:
        return server_states(servers_state_text)
    except BackendError as err:
        raise _named(err, host) from err


def vllm_lb_in_flight(stat_text, servers, host=None):
    """{server: requests in flight} from `show stat` CSV, for the servers named."""
    try:
        return in_flight(stat_text, servers)
    except BackendError as err:
        raise _named(err, host) from err


def vllm_lb_servers(hosts, hostvars, address_var):
    """Every planned server of the backend hosts: [{'name': '<host>-<instance>', 'host', 'address', 'port', 'tls'}]
    (tls: the host has a certificate, vllm_service_tls_certificate, so its instances serve HTTPS)."""
    plans = [(host, hostvars[host].get("vllm_plan")) for host in hosts]
    address_of = {host: hostvars[host].get(address_var, host) for host in hosts}
    tls_of = {host: bool(hostvars[host].get("vllm_service_tls_certificate")) for host in hosts}
    return backend_servers(plans, address_of, tls_of)


def vllm_lb_server_line(server, ca_file):
    """What follows the server's name on its HAProxy `server` line (its endpoint; for TLS, the verification)."""
    return server_line(server, ca_file)


def vllm_lb_held_servers(servers, config_text, backend, hosts=None):
    """The servers with the endpoints the configuration already has kept, and the configured servers the plans of
    `hosts` dropped (each gains 'planned', 'held' and 'retired')."""
    return held_servers(servers, config_text, backend, hosts or ())


def vllm_lb_host_servers(names, host):
    """The server names of `names` that are `host`'s (planned or dropped by its plan)."""
    return host_servers(names, host)


def vllm_lb_capacity(views, leaving, minimum):
    """The load balancers that would keep fewer than `minimum` servers UP and ready while `leaving` drain."""
    fix = "fix: write a whole number of 0 or more, such as 1"
    try:
        number = int(str(minimum).strip()) if not isinstance(minimum, bool) else None
    except ValueError:
        number = None
    if number is None or number < 0:
        raise AnsibleFilterError(f"rollout_min_available: {minimum!r} is not a whole number of 0 or more; {fix}")
    minimum = number
    return capacity_problems(views or {}, leaving or [], minimum)


def vllm_lb_retired_servers(names, host, planned):
    """The server names of `names` that are `host`'s but not among `planned`."""
    return retired_servers(names, host, planned)


def vllm_lb_endpoint_changes(config_text, backend, servers, wanted=None):
    """The servers whose configured endpoint is not the planned one (or the one `wanted` names)."""
    return endpoint_changes(config_text, backend, servers, wanted)


def vllm_lb_retired_on(views, host, planned):
    """The load balancers of `views` ({load balancer: {server: state}}) that have a server of `host` its plan
    dropped (not among `planned`), in the views' order."""
    return [lb for lb, servers in (views or {}).items() if retired_servers(list(servers), host, planned)]


def vllm_lb_not_ready_on(views):
    """The load balancers of `views` ({load balancer: {server: administrative state}}) on which some server is not
    'ready' (drain or maint), in the views' order."""
    return [lb for lb, servers in (views or {}).items() if any(state != "ready" for state in servers.values())]


def vllm_lb_busy(counts):
    """'<server> (<n> in flight)' for each server of `counts` ({server: requests in flight}) with any, in order."""
    return [f"{server} ({count} in flight)" for server, count in (counts or {}).items() if count > 0]


class FilterModule:
    def filters(self):
        return {
            "vllm_lb_removal_check": vllm_lb_removal_check,
            "vllm_lb_server_states": vllm_lb_server_states,
            "vllm_lb_in_flight": vllm_lb_in_flight,
            "vllm_lb_servers": vllm_lb_servers,
            "vllm_lb_server_line": vllm_lb_server_line,
            "vllm_lb_held_servers": vllm_lb_held_servers,
            "vllm_lb_host_servers": vllm_lb_host_servers,
            "vllm_lb_retired_servers": vllm_lb_retired_servers,
            "vllm_lb_capacity": vllm_lb_capacity,
            "vllm_lb_endpoint_changes": vllm_lb_endpoint_changes,
            "vllm_lb_retired_on": vllm_lb_retired_on,
            "vllm_lb_not_ready_on": vllm_lb_not_ready_on,
            "vllm_lb_busy": vllm_lb_busy,
        }
