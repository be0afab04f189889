"""Print the services' journals when a serve test fails."""

import re

import pytest
import testinfra


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    host = item.funcargs.get("host")
    if host is None:
        return
    for unit in ("vllm@*", "haproxy", "prometheus", "prometheus-alertmanager", "prometheus-node-exporter"):
        journal = host.run(f"journalctl --no-pager -n 120 -u '{unit}'")
        report.sections.append((f"journal of {unit} on {host.backend.hostname}", journal.stdout))


def get_host(name, request):
    """Another molecule host than the one under test, with the same backend settings."""
    inventory = request.config.option.ansible_inventory
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory}")


# The CA of the instances' certificates as each kind of host has it (the vLLM host's own probes, the load
# balancer's `ca-file`, Prometheus's tls_config): the instances serve HTTPS in this scenario.
BACKEND_CA_FILES = ("/etc/vllm/tls-ca.crt", "/etc/haproxy/vllm-backend-ca.crt", "/etc/prometheus/vllm-backend-ca.crt")


def backend_ca(host):
    """The instances' CA file on `host`, or '' where it has none."""
    return next((path for path in BACKEND_CA_FILES if host.file(path).exists), "")


def instance_base(host, instance_name):
    """https://<listen address>:<port> of one instance, from its unit's command (http:// without --ssl-certfile)."""
    conf = host.file(f"/etc/systemd/system/vllm@{instance_name}.service.d/instance.conf").content_string
    address = re.search(r"--host (\S+)", conf).group(1)
    port = re.search(r"--port (\d+)", conf).group(1)
    return f"{'https' if '--ssl-certfile' in conf else 'http'}://{address}:{port}"
