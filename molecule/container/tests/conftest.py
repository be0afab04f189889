"""Print the instances' journals when a container scenario test fails."""

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    host = item.funcargs.get("host")
    if host is None:
        return
    journal = host.run("journalctl --no-pager -n 150 -u 'vllm@*'")
    report.sections.append((f"journal of vllm@* on {host.backend.hostname}", journal.stdout))


def get_host(name, request):
    """Another molecule host than the one under test, with the same backend settings."""
    import testinfra

    inventory = request.config.option.ansible_inventory
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory}")
