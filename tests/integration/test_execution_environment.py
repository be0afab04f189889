"""execution-environment.yml is accepted by ansible-builder and carries what the collection needs:
its own artifact (as `ansible-galaxy collection build` names it), galaxy.yml's dependencies at the
versions the tests ran with, pinned ansible-core and ansible-runner, no Python extras; its last step
fails the image build when a collection is missing or at another version (run here against real
collection paths). The image itself is not built here: no container registry is reachable."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from ansible.module_utils.compat.version import LooseVersion
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
    pinned = {c["name"]: c["version"] for c in collections if c.get("type") != "file"}
    assert set(pinned) == set(GALAXY["dependencies"]), "the EE's collections differ from galaxy.yml's dependencies"
    tested = _tested_collection_versions()
    for name, version in pinned.items():
        assert version == f"=={tested[name]}", f"{name}: the EE pins {version}, the tests ran {tested[name]}"
        low = GALAXY["dependencies"][name].removeprefix(">=")
        assert LooseVersion(tested[name]) >= LooseVersion(low), f"{name} {tested[name]} is below galaxy.yml's {low}"
    assert not (built / "requirements.txt").exists(), "the EE installs Python packages the collection does not use"
    assert "ansible-core==" in containerfile + (context / "Containerfile").read_text()
    assert all("==" in dep["package_pip"] for key, dep in EE["dependencies"].items() if key.startswith("ansible_"))


EE = yaml.safe_load((REPO / "execution-environment.yml").read_text())


def _tested_collection_versions():
    """{name: version} as Ansible finds them here (first path wins): what the tests ran with."""
    listed = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "list", "--format", "json"],
        capture_output=True, text=True, timeout=120, check=True,
        env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.devnull),
    )
    return {n: v["version"] for p in reversed(list(json.loads(listed.stdout).values())) for n, v in p.items()}


def _final_check(collections_path):
    (step,) = EE["additional_build_steps"]["append_final"]
    assert step.startswith("RUN "), step
    return subprocess.run(
        ["sh", "-c", step.removeprefix("RUN ")],
        capture_output=True, text=True, timeout=120, check=False,
        env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections_path),
                 PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}"),
    )


def test_the_final_step_checks_every_collection_at_its_version(tmp_path):
    step = EE["additional_build_steps"]["append_final"][0]
    names = {c["name"]: c["version"].removeprefix("==") for c in EE["dependencies"]["galaxy"]["collections"]
             if c.get("type") != "file"}
    names[f"{GALAXY['namespace']}.{GALAXY['name']}"] = GALAXY["version"]
    for name, version in names.items():
        assert f" {name}=={version}" in step, f"the final step does not check {name}=={version}"
    # Without the collection itself (only the ansible package's collections): the build must fail.
    missing = _final_check(tmp_path / "empty")
    assert missing.returncode != 0 and "vllm.cpu_fleet==" in missing.stderr, missing.stdout + missing.stderr
    # With the artifact installed: every name at its version.
    build = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path / "dist"), str(REPO)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert build.returncode == 0, build.stderr
    (artifact,) = (tmp_path / "dist").glob("*.tar.gz")
    install = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "--force", "-p", str(tmp_path / "cols"),
         str(artifact)],
        capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=str(tmp_path / "none.cfg")),
    )
    assert install.returncode == 0, install.stdout + install.stderr
    present = _final_check(tmp_path / "cols")
    assert present.returncode == 0, present.stdout + present.stderr
    # A collection at another version than the pinned one is refused too.
    manifest = tmp_path / "cols/ansible_collections/vllm/cpu_fleet/MANIFEST.json"
    data = json.loads(manifest.read_text())
    data["collection_info"]["version"] = "0.0.1"
    manifest.write_text(json.dumps(data))
    other = _final_check(tmp_path / "cols")
    assert other.returncode != 0 and "vllm.cpu_fleet==" in other.stderr, other.stdout + other.stderr
