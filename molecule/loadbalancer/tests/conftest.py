"""On a failed test, attach what HAProxy logged and its servers' state to the report."""

import os

import pytest
import testinfra

LB = "lb-haproxy"


def lb_host():
    inventory = os.environ.get("MOLECULE_INVENTORY_FILE", "")
    return testinfra.get_host(f"ansible://{LB}", ansible_inventory=inventory)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" and report.failed:
        host = lb_host()
        journal = host.run("journalctl -u haproxy --no-pager -n 200")
        report.sections.append(("journalctl -u haproxy", journal.stdout + journal.stderr))
        stat = host.run("echo 'show stat vllm 4 -1' | socat stdio unix-connect:/run/haproxy/admin.sock")
        report.sections.append(("haproxy show stat", stat.stdout + stat.stderr))
    return report
