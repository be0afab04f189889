"""execution-environment.yml is accepted by ansible-builder and carries what the project needs."""

import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO

ANSIBLE_BUILDER = str(Path(sys.executable).parent / "ansible-builder")


def test_ansible_builder_creates_the_build_context(tmp_path):
    result = subprocess.run(
        [ANSIBLE_BUILDER, "create", "-f", str(REPO / "execution-environment.yml"), "-c", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    containerfile = (tmp_path / "Containerfile").read_text()
    assert "ansible-galaxy collection install" in containerfile
    build = tmp_path / "_build"
    collections = yaml.safe_load((build / "requirements.yml").read_text())["collections"]
    assert {c["name"] for c in collections} == {"ansible.posix", "community.general", "containers.podman"}
    python_reqs = (build / "requirements.txt").read_text()
    pinned = {line for line in (REPO / "requirements.txt").read_text().splitlines() if line and line[0] != "#"}
    for requirement in python_reqs.split():
        assert requirement in pinned, f"{requirement} differs from requirements.txt"
