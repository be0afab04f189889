"""module_utils/vllm_lb_backends.py: the servers' endpoints a load balancer play writes (held where configured) and
the moves the rollout makes inside each host's drained window (review day2-edges, finding 1)."""

from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_lb_backends import (
    backend_servers,
    configured_endpoints,
    endpoint_changes,
    held_servers,
    server_line,
    split_endpoint,
)

CONFIG = """
frontend vllm_api
    bind :8080
    default_backend vllm

backend other
    server h1-vllm-0 10.0.0.9:9999

backend vllm
    balance leastconn
    server h1-vllm-0 10.0.0.1:8000
    server h1-vllm-1 10.0.0.1:8001 check
    server h2-vllm-0 fd00::2:8000
"""


def plans(port=8000, count=2):
    return [(h, {"instances": [{"name": f"vllm-{i}", "port": port + i} for i in range(count)]}) for h in ("h1", "h2")]


ADDRESSES = {"h1": "10.0.0.1", "h2": "fd00::2"}


def test_configured_endpoints_of_one_backend():
    assert configured_endpoints(CONFIG, "vllm") == {
        "h1-vllm-0": "10.0.0.1:8000",
        "h1-vllm-1": "10.0.0.1:8001",
        "h2-vllm-0": "fd00::2:8000",
    }
    assert configured_endpoints("", "vllm") == {}


def test_split_endpoint_takes_the_port_after_the_last_colon():
    assert split_endpoint("fd00::2:8000") == ("fd00::2", 8000, False)
    assert split_endpoint("[fd00::2]:8000") == ("fd00::2", 8000, False)
    assert split_endpoint("lb.example:80") == ("lb.example", 80, False)
    assert split_endpoint("https://fd00::2:8000") == ("fd00::2", 8000, True)


def test_backend_servers_name_and_address_every_instance():
    servers = backend_servers(plans(), ADDRESSES)
    assert [s["name"] for s in servers] == ["h1-vllm-0", "h1-vllm-1", "h2-vllm-0", "h2-vllm-1"]
    assert servers[2] == {"name": "h2-vllm-0", "host": "h2", "address": "fd00::2", "port": 8000, "tls": False}
    assert backend_servers([("h3", {"instances": [{"name": "vllm-0", "port": 8000}]})], {})[0]["address"] == "h3"


def test_a_new_port_is_held_where_configured_and_new_servers_get_the_plan():
    written = held_servers(backend_servers(plans(port=8100), ADDRESSES), CONFIG, "vllm")
    by_name = {s["name"]: s for s in written}
    assert (by_name["h1-vllm-0"]["address"], by_name["h1-vllm-0"]["port"]) == ("10.0.0.1", 8000)
    assert by_name["h1-vllm-0"]["held"] and by_name["h1-vllm-0"]["planned"] == "10.0.0.1:8100"
    assert (by_name["h2-vllm-0"]["address"], by_name["h2-vllm-0"]["port"]) == ("fd00::2", 8000)
    # Not configured yet: written as planned.
    assert (by_name["h2-vllm-1"]["port"], by_name["h2-vllm-1"]["held"]) == (8101, False)


def test_an_unchanged_plan_holds_nothing():
    assert not any(s["held"] for s in held_servers(backend_servers(plans(), ADDRESSES), CONFIG, "vllm"))


def test_the_moves_of_one_host_and_the_way_back():
    h1 = [s for s in backend_servers(plans(port=8100), ADDRESSES) if s["host"] == "h1"]
    moves = endpoint_changes(CONFIG, "vllm", h1)
    assert moves == [
        {"name": "h1-vllm-0", "host": "h1", "from": "10.0.0.1:8000", "to": "10.0.0.1:8100", "address": "10.0.0.1",
         "port": 8100, "tls": False, "runtime": True},
        {"name": "h1-vllm-1", "host": "h1", "from": "10.0.0.1:8001", "to": "10.0.0.1:8101", "address": "10.0.0.1",
         "port": 8101, "tls": False, "runtime": True},
    ]  # fmt: skip
    moved = CONFIG.replace(":8000\n", ":8100\n", 1).replace(":8001 check", ":8101 check")
    assert endpoint_changes(moved, "vllm", h1) == []
    back = endpoint_changes(moved, "vllm", h1, {m["name"]: m["from"] for m in moves})
    assert [(m["name"], m["to"]) for m in back] == [("h1-vllm-0", "10.0.0.1:8000"), ("h1-vllm-1", "10.0.0.1:8001")]
    # An empty wanted map moves nothing (a rollback with no recorded move).
    assert endpoint_changes(moved, "vllm", h1, {}) == []


def test_a_move_to_a_name_needs_a_reload():
    h2 = [{"name": "h2-vllm-0", "host": "h2", "address": "h2.example", "port": 8000}]
    assert endpoint_changes(CONFIG, "vllm", h2) == [
        {"name": "h2-vllm-0", "host": "h2", "from": "fd00::2:8000", "to": "h2.example:8000", "address": "h2.example",
         "port": 8000, "tls": False, "runtime": False}
    ]  # fmt: skip


TLS_CONFIG = CONFIG.replace(
    "server h1-vllm-1 10.0.0.1:8001 check",
    "server h1-vllm-1 10.0.0.1:8001 ssl verify required ca-file /etc/haproxy/ca.crt verifyhost h1",
)


def test_a_server_line_with_ssl_is_an_https_endpoint():
    assert configured_endpoints(TLS_CONFIG, "vllm")["h1-vllm-1"] == "https://10.0.0.1:8001"
    assert configured_endpoints(TLS_CONFIG, "vllm")["h1-vllm-0"] == "10.0.0.1:8000"


def test_the_server_line_verifies_a_named_host_and_only_the_chain_of_an_address():
    named = {"host": "h1", "address": "10.0.0.1", "port": 8000, "tls": True}
    assert server_line(named, "/ca") == "10.0.0.1:8000 ssl verify required ca-file /ca verifyhost h1"
    assert server_line(dict(named, host="10.0.0.1"), "/ca") == "10.0.0.1:8000 ssl verify required ca-file /ca"
    assert server_line(dict(named, tls=False), "/ca") == "10.0.0.1:8000"


def test_tls_turned_on_is_held_where_configured_and_moved_in_the_window_with_a_reload():
    servers = backend_servers(plans(), ADDRESSES, {"h1": True, "h2": True})
    written = {s["name"]: s for s in held_servers(servers, CONFIG, "vllm")}
    # The load balancer play keeps what HAProxy has: plain until each host's window.
    assert written["h1-vllm-0"]["tls"] is False and written["h1-vllm-0"]["held"]
    assert written["h1-vllm-0"]["planned"] == "https://10.0.0.1:8000"
    # A server the configuration does not have yet gets the plan (TLS).
    assert written["h2-vllm-1"]["tls"] is True and not written["h2-vllm-1"]["held"]
    moves = {m["name"]: m for m in endpoint_changes(CONFIG, "vllm", servers[:2])}
    assert moves["h1-vllm-0"]["from"] == "10.0.0.1:8000" and moves["h1-vllm-0"]["to"] == "https://10.0.0.1:8000"
    # Same address, another scheme: the admin socket cannot switch it, a reload does.
    assert moves["h1-vllm-0"]["runtime"] is False and moves["h1-vllm-0"]["tls"] is True


def test_a_rollback_moves_an_https_server_back_to_plain():
    servers = backend_servers(plans(), ADDRESSES, {"h1": True})[:2]
    moves = endpoint_changes(TLS_CONFIG, "vllm", servers, wanted={"h1-vllm-1": "10.0.0.1:8001"})
    assert [(m["name"], m["to"], m["tls"], m["runtime"]) for m in moves] == [
        ("h1-vllm-1", "10.0.0.1:8001", False, False)
    ]
    # An IP move that keeps TLS stays a runtime move.
    moved = endpoint_changes(TLS_CONFIG, "vllm", servers, wanted={"h1-vllm-1": "https://10.0.0.7:8001"})
    assert moved[0]["runtime"] is True
