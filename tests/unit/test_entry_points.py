"""The checkout's command-line tools start as a user runs them: from any directory, with no PYTHONPATH.

Tests import their modules in a process whose sys.path already holds the collection (tests/conftest.py), so an
import the script itself cannot resolve (the release probe's, once) passes every other test.
"""

import os
import subprocess
import sys

import pytest
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

SCRIPTS = sorted(p.relative_to(REPO) for folder in ("tools", "benchmarks") for p in (REPO / folder).glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_the_script_starts_alone(script, tmp_path):
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(REPO / script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
