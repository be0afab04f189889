"""Print the services' journals when a serve test fails."""

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
