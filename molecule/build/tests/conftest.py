"""On failure, print the builder's build log tail and the vLLM journal."""

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
    log = host.run("tail -n 40 /var/lib/vllm-build/*/build.log")
    report.sections.append((f"build log on {host.backend.hostname}", log.stdout + log.stderr))
    journal = host.run("journalctl --no-pager -n 80 -u 'vllm@*'")
    report.sections.append((f"vLLM journal on {host.backend.hostname}", journal.stdout))
