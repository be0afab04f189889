"""module_utils/vllm_lb_backends.py: a server the new plan drops (issue 31, item 8). The load balancer play keeps it
until its host's rollout (its instance serves until then), the host's drain covers it, and the rollout removes it
after the host's gate; the removal guard counts only servers of hosts outside the run."""

from ansible_collections.vllm.cpu_fleet.plugins.filter.vllm_loadbalancer import FilterModule
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_lb_backends import (
    backend_servers,
    held_servers,
    host_servers,
    removal_check,
    retired_servers,
    server_owner,
)

CONFIG = """
backend vllm
    balance leastconn
    server web-vllm-0 10.0.0.1:8000
    server web-vllm-1 10.0.0.1:8001
    server web-2-vllm-0 10.0.0.2:8000
    server web-2-vllm-1 10.0.0.2:8001
"""
ADDRESSES = {"web": "10.0.0.1", "web-2": "10.0.0.2"}


def planned(counts):
    """The planned servers of hosts {host: instances}, ports 8000 on."""
    plans = [(host, {"instances": [{"name": f"vllm-{i}", "port": 8000 + i} for i in range(n)]}) for host, n in counts]
    return backend_servers(plans, ADDRESSES)


def test_a_server_belongs_to_the_host_before_its_last_instance_name():
    assert server_owner("web-2-vllm-0", ["web", "web-2"]) == "web-2"
    # A run without web-2 (a slice) never takes web-2's server for web's.
    assert server_owner("web-2-vllm-0", ["web"]) is None
    assert server_owner("web-vllm-1", ["web"]) == "web"
    assert server_owner("other-1", ["web"]) is None
    names = ["web-vllm-0", "web-vllm-1", "web-2-vllm-0"]
    assert host_servers(names, "web") == ["web-vllm-0", "web-vllm-1"]
    assert retired_servers(names, "web", ["web-vllm-0"]) == ["web-vllm-1"]
    assert retired_servers(names, "web-2", ["web-2-vllm-0", "web-2-vllm-1"]) == []


def test_the_load_balancer_play_keeps_a_dropped_server_as_configured_after_its_hosts_planned_ones():
    servers = planned([("web", 1), ("web-2", 2)])
    written = held_servers(servers, CONFIG, "vllm", ["web", "web-2"])
    assert [(s["name"], s["address"], s["port"], s["retired"]) for s in written] == [
        ("web-vllm-0", "10.0.0.1", 8000, False),
        ("web-vllm-1", "10.0.0.1", 8001, True),
        ("web-2-vllm-0", "10.0.0.2", 8000, False),
        ("web-2-vllm-1", "10.0.0.2", 8001, False),
    ]
    # The same lines in the same order as configured: the play changes nothing until the rollout removed it.
    assert [f"    server {s['name']} {s['address']}:{s['port']}" for s in written] == CONFIG.strip().splitlines()[2:]


def test_a_dropped_server_of_a_host_outside_the_run_is_not_kept():
    written = held_servers(planned([("web", 1)]), CONFIG, "vllm", ["web"])
    assert [s["name"] for s in written] == ["web-vllm-0", "web-vllm-1"]
    # Without hosts (as before): only the planned servers.
    assert [s["name"] for s in held_servers(planned([("web", 1)]), CONFIG, "vllm")] == ["web-vllm-0"]


def test_the_removal_guard_does_not_count_what_the_rollout_removes_in_each_hosts_window():
    # Every host drops an instance: half the servers, past the 25 % guard, yet nothing leaves at once.
    names = [s["name"] for s in planned([("web", 1), ("web-2", 1)])]
    assert removal_check(CONFIG, "vllm", names, 25, hosts=["web", "web-2"]) == {"removed": [], "problem": ""}
    # A slice holding only web still stops: web-2's servers would go.
    sliced = removal_check(CONFIG, "vllm", ["web-vllm-0"], 25, hosts=["web"])
    assert sliced["removed"] == ["web-2-vllm-0", "web-2-vllm-1"] and sliced["problem"]


def test_the_filters_pass_the_hosts_on():
    filters = FilterModule().filters()
    written = filters["vllm_lb_held_servers"](planned([("web", 1)]), CONFIG, "vllm", ["web"])
    assert [s["name"] for s in written if s["retired"]] == ["web-vllm-1"]
    assert filters["vllm_lb_retired_servers"](["web-vllm-0", "web-vllm-1"], "web", ["web-vllm-0"]) == ["web-vllm-1"]
    assert filters["vllm_lb_host_servers"](["web-vllm-0", "web-2-vllm-0"], "web-2") == ["web-2-vllm-0"]
    check = filters["vllm_lb_removal_check"](CONFIG, "vllm", ["web-vllm-0"], 25, "vllm_hosts", "lb", ["web", "web-2"])
    assert check == {"removed": [], "problem": ""}
