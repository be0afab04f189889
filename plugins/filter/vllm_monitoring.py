"""Thin Jinja2 filter: the endpoints a monitoring host scrapes (the monitoring role's reach check)."""


def vllm_monitoring_reach_targets(
    vllm_hosts, hostvars, exporter_hosts, loadbalancers, address_var, node_exporter_port, haproxy_exporter_port
):
    """[{'name', 'address', 'port'}]: every planned instance of the vLLM hosts, then each exporter host's node
    exporter (and HAProxy's exporter on a load balancer). Only hosts preflight decided about this run
    (vllm_fleet_converged defined); the address is the host's `address_var`, else its inventory name."""

    def address(host):
        return str(hostvars[host].get(address_var, host))

    def decided(host):
        return "vllm_fleet_converged" in hostvars[host]

    out = []
    for host in [h for h in vllm_hosts if decided(h)]:
        out += [
            {"name": host, "address": address(host), "port": int(instance["port"])}
            for instance in hostvars[host]["vllm_plan"]["instances"]
        ]
    for host in [h for h in exporter_hosts if decided(h)]:
        out.append({"name": host, "address": address(host), "port": int(node_exporter_port)})
        if host in loadbalancers:
            out.append({"name": host, "address": address(host), "port": int(haproxy_exporter_port)})
    return out


class FilterModule:
    def filters(self):
        return {"vllm_monitoring_reach_targets": vllm_monitoring_reach_targets}
