"""The addresses a firewall or ACL admits for a group (plugins/filter/vllm_fleet_sources.py)."""

from ansible_collections.vllm.cpu_fleet.plugins.filter.vllm_fleet_sources import vllm_fleet_sources

HOSTVARS = {
    "mon-1": {"ansible_facts": {"all_ipv4_addresses": ["10.0.0.5", "172.17.0.1"], "all_ipv6_addresses": ["fd00::5"]}},
    "mon-2": {"ansible_facts": {"all_ipv4_addresses": ["10.0.0.5", "10.0.0.6"]}},
    "new": {},
}


def test_every_address_of_every_host_once_in_order():
    assert vllm_fleet_sources(["mon-1", "mon-2"], HOSTVARS) == ["10.0.0.5", "172.17.0.1", "fd00::5", "10.0.0.6"]


def test_the_inventory_override_wins_and_a_host_without_facts_adds_nothing():
    assert vllm_fleet_sources(["mon-1"], HOSTVARS, ["192.0.2.0/24", "192.0.2.0/24"]) == ["192.0.2.0/24"]
    assert vllm_fleet_sources(["new"], HOSTVARS) == []
    assert vllm_fleet_sources([], HOSTVARS, []) == []
