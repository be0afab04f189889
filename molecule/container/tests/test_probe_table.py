"""Closed by default in container mode (issue 44, item 1): molecule/serve's probe table, run against a container
host. The outsider (the podman host), the load balancer, the other vLLM host (a peer) and the host itself probe the
load balancer's routes, the instance ports (the containers share the host's network) and every other listener, with
no key, an empty key, a wrong key and the right one; each cell is checked as in serve (this scenario has no
monitoring host)."""

import importlib.util
from pathlib import Path

import pytest

testinfra_hosts = ["ansible://container-vllm-1"]

_SPEC = importlib.util.spec_from_file_location(
    "serve_probe_table", Path(__file__).resolve().parents[2] / "serve/tests/test_probe_table.py"
)
serve_probe = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(serve_probe)
SHAPE = {"target": "container-vllm-1", "lb": "container-lb", "monitoring": None, "peer": "container-vllm-2"}


@pytest.fixture(scope="module")
def fleet(host, request):
    return serve_probe.read_fleet(host, request, SHAPE)


def test_every_vantage_point_gets_what_closed_by_default_allows_and_no_more(host, fleet, request, capsys):
    cells, lines = serve_probe.probe_table(host, fleet, request, capsys, SHAPE)
    # Without a key the instance's open paths answer the load balancer (its health checks).
    assert "200" in cells[("container-lb", f"instance:{fleet['ports'][0]}", "none")], lines
    assert fleet["others"], f"no listener besides the instance ports to probe: {fleet}"
