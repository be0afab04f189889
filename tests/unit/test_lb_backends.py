"""The load balancer's backend guard: the configured servers read from HAProxy's configuration, and
how many of them one run may take away."""

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_lb_backends import (
    BackendError,
    configured_servers,
    removal_check,
    removal_limit,
)
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

CONFIG = """\
global
    log stdout format raw local0
    stats socket /run/haproxy/admin.sock mode 660 level admin

defaults
    mode http

frontend api
    bind *:8080 ssl crt /etc/haproxy/tls/server.pem alpn http/1.1
    default_backend vllm

backend other
    server other-1 10.0.0.9:80

backend vllm
    balance leastconn
    # server commented-out 10.0.0.8:8000
    default-server check inter 2s fall 3 rise 2
    server h1-vllm-0 10.0.0.1:8000
    server h1-vllm-1 10.0.0.1:8001
    server h2-vllm-0 10.0.0.2:8000
    server h3-vllm-0 10.0.0.3:8000

listen stats
    server not-a-backend-server 127.0.0.1:1
"""
FLEET = ["h1-vllm-0", "h1-vllm-1", "h2-vllm-0", "h3-vllm-0"]


def test_only_the_named_backends_server_lines_count():
    assert configured_servers(CONFIG, "vllm") == FLEET
    assert configured_servers(CONFIG, "other") == ["other-1"]
    assert configured_servers(CONFIG, "missing") == []
    assert configured_servers("", "vllm") == []


def test_the_role_template_renders_lines_the_reader_finds():
    # The reader and roles/loadbalancer/templates/haproxy.cfg.j2 must agree on the server line's shape.
    template = (REPO / "roles/loadbalancer/templates/haproxy.cfg.j2").read_text()
    assert "backend {{ loadbalancer_backend_name }}" in template
    assert "    server {{ server.name }} {{ server | vllm.cpu_fleet.vllm_lb_server_line(" in template


def test_a_slice_of_the_fleet_is_stopped_and_names_what_it_would_remove():
    result = removal_check(CONFIG, "vllm", ["h1-vllm-0", "h1-vllm-1"], 25, "vllm_hosts")
    assert result["removed"] == ["h2-vllm-0", "h3-vllm-0"]
    assert "would take 2 of the 4 servers" in result["problem"]
    assert "h2-vllm-0, h3-vllm-0" in result["problem"]
    assert "loadbalancer_max_removed_servers_percent=100" in result["problem"]


@pytest.mark.parametrize(
    ("planned", "percent", "stopped"),
    [
        (FLEET, 25, False),  # nothing removed
        ([*FLEET, "h4-vllm-0"], 0, False),  # growing never stops
        (FLEET[:3], 0, False),  # one server may always go
        (FLEET[:2], 25, True),
        (FLEET[:2], 50, False),
        (FLEET[:2], "50", False),  # from -e
        ([], 75, True),
        ([], "100", False),
    ],
)
def test_the_limit_is_a_share_of_the_configured_servers_and_never_below_one(planned, percent, stopped):
    assert bool(removal_check(CONFIG, "vllm", planned, percent)["problem"]) is stopped


def test_a_first_configuration_has_nothing_to_remove():
    assert removal_check("", "vllm", FLEET, 0) == {"removed": [], "problem": ""}


@pytest.mark.parametrize("bad", [-1, 101, "x", "", None, "1.5"])
def test_a_bad_percentage_names_the_variable_and_the_fix(bad):
    with pytest.raises(BackendError, match=r"loadbalancer_max_removed_servers_percent: .*; fix: give a whole number"):
        removal_limit(bad, 4)
