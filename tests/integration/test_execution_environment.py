"""execution-environment.yml is accepted by ansible-builder and carries what the project needs:
the collection's own artifact (as `ansible-galaxy collection build` names it), the collections
of requirements.yml and the pinned Python of requirements.txt."""

import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO

BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
ARTIFACT = f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz"


def test_ansible_builder_creates_the_build_context(tmp_path):
    # The EE file names dist/<artifact> beside itself: build it there, in a scratch copy.
    shutil.copy(REPO / "execution-environment.yml", tmp_path)
    build = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path / "dist"), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )
    assert build.returncode == 0, build.stderr
    assert (tmp_path / "dist" / ARTIFACT).is_file(), (
        "execution-environment.yml names another artifact than the build makes"
    )
    context = tmp_path / "context"
    result = subprocess.run(
        [str(BIN / "ansible-builder"), "create", "-f", str(tmp_path / "execution-environment.yml"), "-c", str(context)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    containerfile = (context / "Containerfile").read_text()
    assert "ansible-galaxy collection install" in containerfile
    built = context / "_build"
    collections = yaml.safe_load((built / "requirements.yml").read_text())["collections"]
    artifact = f"artifacts/{ARTIFACT}"
    assert {"name": artifact, "type": "file"} in collections
    assert (built / artifact).is_file()
    wanted = yaml.safe_load((REPO / "requirements.yml").read_text())["collections"]
    assert [c for c in collections if c.get("type") != "file"] == wanted, (
        "the EE's collections differ from requirements.yml"
    )
    python_reqs = (built / "requirements.txt").read_text()
    pinned = {line for line in (REPO / "requirements.txt").read_text().splitlines() if line and line[0] != "#"}
    for requirement in python_reqs.split():
        assert requirement in pinned, f"{requirement} differs from requirements.txt"
