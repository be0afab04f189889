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


# ---- the rollout's capacity floor (issue 41, item 4) ----


def _views(**lbs):
    return {
        lb: {name: {"admin": admin, "up": up} for name, (admin, up) in servers.items()} for lb, servers in lbs.items()
    }


def test_capacity_counts_up_and_ready_servers_less_the_leaving_hosts():
    from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_lb_backends import capacity_problems

    views = _views(
        lb1={"a-vllm-0": ("ready", True), "a-vllm-1": ("ready", True), "b-vllm-0": ("ready", True),
             "web-2-vllm-0": ("ready", True)},
        lb2={"a-vllm-0": ("ready", True), "b-vllm-0": ("drain", True), "web-2-vllm-0": ("ready", False),
             "web-vllm-0": ("maint", True)},
    )  # fmt: skip
    assert capacity_problems(views, [], 1) == []
    # a's two servers leave; on lb2 nothing else is UP and ready (b drained, web-2 DOWN, web in maintenance).
    (problem,) = capacity_problems(views, ["a"], 1)
    assert problem == (
        "lb2: 0 of 4 servers would stay UP and ready while a drain (1 of theirs); rollout_min_available is 1;"
        " not UP and ready already: b-vllm-0, web-2-vllm-0, web-vllm-0"
    )
    # A host named like another's prefix ("web" vs "web-2") takes only its own servers.
    assert capacity_problems(views, ["web"], 2) == [
        "lb2: 1 of 4 servers would stay UP and ready while web drain (1 of theirs); rollout_min_available is 2;"
        " not UP and ready already: b-vllm-0, web-2-vllm-0"
    ]
    assert capacity_problems(views, ["a", "b", "web-2"], 0) == []
    assert [p.split(":")[0] for p in capacity_problems(views, ["a", "b", "web-2"], 1)] == ["lb1", "lb2"]
    assert capacity_problems({}, ["a"], 5) == []  # no load balancer: nothing to keep


def test_the_filter_refuses_a_floor_that_is_not_a_whole_number_of_zero_or_more():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.vllm.cpu_fleet.plugins.filter.vllm_loadbalancer import vllm_lb_capacity

    views = _views(lb={"a-vllm-0": ("ready", True)})
    assert vllm_lb_capacity(views, ["a"], "0") == []
    assert vllm_lb_capacity(views, [], " 1 ") == []
    for bad in ("-1", "one", "1.5", True, None, -2):
        with pytest.raises(AnsibleFilterError, match="rollout_min_available"):
            vllm_lb_capacity(views, ["a"], bad)
