"""The HTML fleet report in a real browser: headless Chromium opens the page (nothing to fetch, no script),
its DOM holds every host row and the charts' SVG and no template leftovers, and a screenshot is taken.

Chromium is a test dependency (scripts/bootstrap.sh installs it): without it these tests fail, they do not
skip. FLEET_REPORT_SCREENSHOT=docs/images/fleet-report.png keeps the fake fleet's screenshot there.
"""

import html
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import MACHINE_NAMES, REPO

sys.path.insert(0, str(REPO / "tests" / "fixtures"))
import fleet_report_fake as fake
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_fleet_report as report

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ANSIBLE_PLAYBOOK = str(REPO / ".venv" / "bin" / "ansible-playbook")
if not os.path.exists(ANSIBLE_PLAYBOOK):
    ANSIBLE_PLAYBOOK = shutil.which("ansible-playbook") or "ansible-playbook"
PNG = b"\x89PNG\r\n\x1a\n"


def chromium(tmp_path, page, *args):
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is missing: run scripts/bootstrap.sh (it installs chromium)"
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1400,1000",
        *args,
        page.as_uri(),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def check_dom(dom, hosts, classes):
    assert "</html>" in dom and "<table>" in dom
    for leftover in ("Undefined", "{{", "}}", "{%", "Traceback"):
        assert leftover not in dom, leftover
    # The page runs no script: the markup host name is text, never an element.
    assert "<script" not in dom.lower()
    for host in hosts:
        assert f"<td>{html.escape(host, quote=False)}</td>" in dom or f">{html.escape(host, quote=False)}</td>" in dom
    for name in classes:
        block = re.search(rf'<div class="charts" data-class="{re.escape(html.escape(name))}">(.*?)</div>', dom)
        assert block and block[1].count("<svg") == 2, name


def test_the_fake_fleet_report_renders_in_chromium(tmp_path):
    hosts, hostvars, lbs, mon, options = fake.fake_fleet(benchmark=True)
    built = report.build_report(hosts, hostvars, lbs, mon, options)
    page = tmp_path / "fleet-report.html"
    page.write_text(report.render_html(built))
    dom = chromium(tmp_path, page, "--dump-dom")
    charted = [c["name"] for c in built["classes"] if c["instances"]]
    check_dom(dom, hosts, charted)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert dom.count("<svg") == 2 * len(charted) + 1  # and the benchmark's

    png = tmp_path / "fleet-report.png"
    chromium(tmp_path, page, f"--screenshot={png}")
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 20_000
    keep = os.environ.get("FLEET_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(png, REPO / keep)


@pytest.fixture
def playbook_report(tmp_path, machine_root):
    """The report facts.yml writes for the recorded machines (no state reader, nothing listening)."""
    hosts = {name: {"vllm_plan_facts_root": str(machine_root(name))} for name in MACHINE_NAMES}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {
                        "ansible_connection": "local",
                        "ansible_python_interpreter": sys.executable,
                        "vllm_version": "0.32.0",
                    },
                    "children": {"vllm_hosts": {"hosts": hosts}},
                }
            }
        )
    )
    done = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(inventory), "playbooks/facts.yml"],
        cwd=REPO,
        env={**os.environ, "FLEET_REPORT_DIR": str(tmp_path / "report")},
        capture_output=True,
        text=True,
        timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    return tmp_path / "report" / "fleet-report.html"


def test_the_playbooks_report_renders_in_chromium(tmp_path, playbook_report):
    dom = chromium(tmp_path, playbook_report, "--dump-dom")
    classes = sorted(set(re.findall(r'data-class="([^"]+)"', playbook_report.read_text())))
    assert classes, "no host class charts"
    check_dom(dom, MACHINE_NAMES, [html.unescape(c) for c in classes])
    assert "vllm_fleet_state.py is missing on the host" in dom


def test_a_report_that_differs_only_in_its_time_is_not_rewritten(tmp_path, playbook_report):
    # A no-op re-run changes nothing (issue 42): the same report an hour later is no change; another report is one.
    markdown = playbook_report.with_suffix(".md")
    stamp = re.compile(r", generated \d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC")
    for path in (playbook_report, markdown):
        text = path.read_text()
        assert stamp.search(text), f"{path.name} has no time stamp"
        path.write_text(stamp.sub(", generated 2000-01-01 00:00 UTC", text))
    markdown.write_text(markdown.read_text() + "\nA line the fleet does not say.\n")
    inventory = playbook_report.parent.parent / "inventory.yml"
    again = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(inventory), "playbooks/facts.yml"],
        cwd=REPO,
        env={**os.environ, "FLEET_REPORT_DIR": str(playbook_report.parent)},
        capture_output=True,
        text=True,
        timeout=600, check=False,
    )
    assert again.returncode == 0, again.stdout[-3000:]
    assert "generated 2000-01-01 00:00 UTC" in playbook_report.read_text(), "the same report was written again"
    assert "generated 2000-01-01" not in markdown.read_text() and "does not say" not in markdown.read_text()
    assert re.search(r"changed: \[localhost\] => \(item=\S+fleet-report\.md\)", again.stdout), again.stdout[-2000:]
    assert not re.search(r"changed: \[localhost\] => \(item=\S+fleet-report\.html\)", again.stdout)
