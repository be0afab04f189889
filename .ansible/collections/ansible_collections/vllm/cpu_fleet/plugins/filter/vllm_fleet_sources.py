"""Thin Jinja2 filter: the addresses a firewall or an ACL admits for a group of hosts (one place for every role)."""


def vllm_fleet_sources(hosts, hostvars, override=None):
    """override when it names any address or network; else every IPv4 and IPv6 address in the hosts' facts
    (all_ipv4_addresses, all_ipv6_addresses, which preflight gathers), each once, in order."""
    if override:
        return list(dict.fromkeys(str(item) for item in override))
    found = []
    for host in hosts or []:
        facts = hostvars[host].get("ansible_facts") or {}
        found += [str(a) for a in facts.get("all_ipv4_addresses") or []]
        found += [str(a) for a in facts.get("all_ipv6_addresses") or []]
    return list(dict.fromkeys(found))


class FilterModule:
    def filters(self):
        return {"vllm_fleet_sources": vllm_fleet_sources}
