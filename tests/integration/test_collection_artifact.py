"""The collection as users get it: `ansible-galaxy collection build` makes the artifact, it
installs into an empty path, and from outside the checkout ansible-doc shows its plugins, the
module and a filter run, and its playbooks parse. Nothing of the checkout is on any path."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO

BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((REPO / "galaxy.yml").read_text())
FQCN = f"{GALAXY['namespace']}.{GALAXY['name']}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(artifact, env, cwd): the built tarball, and an environment that sees only its installed copy."""
    work = tmp_path_factory.mktemp("collection")
    build = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work / "dist"), str(REPO)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )
    assert build.returncode == 0, build.stderr
    (artifact,) = (work / "dist").glob("*.tar.gz")
    # --no-deps: community.general comes with the ansible package, Galaxy is not needed here.
    install = subprocess.run(
        [
            str(BIN / "ansible-galaxy"),
            "collection",
            "install",
            "--no-deps",
            "-p",
            str(work / "installed"),
            str(artifact),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )
    assert install.returncode == 0, install.stderr
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(work / "none.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(work / "installed"),
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_NOCOLOR="1",
        PYTHONPATH="",
    )
    return artifact, env, work


def run(installed, *argv):
    _unused, env, cwd = installed
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_artifact_holds_the_collection_and_no_checkout_files(installed):
    artifact, _unused, _unused = installed
    with tarfile.open(artifact) as tar:
        names = set(tar.getnames())
    wanted = {"MANIFEST.json", "meta/runtime.yml", "playbooks/site.yml", "plugins/modules/vllm_cpu_facts.py", "LICENSE"}
    assert wanted | {"roles/vllm_plan/tasks/main.yml"} <= names
    # The license galaxy.yml names is the one the artifact carries (Galaxy and most companies need the text).
    with tarfile.open(artifact) as tar:
        text = tar.extractfile("LICENSE").read().decode()
    assert GALAXY["license"] == ["Apache-2.0"] and "Apache License" in text and "Version 2.0" in text
    leaked = sorted(
        name
        for name in names
        if name.split("/")[0] in {".cache", ".venv", "collections", "tests", "molecule", "inventories", "ansible.cfg"}
        or "__pycache__" in name
    )
    assert not leaked, f"checkout-only files in the artifact: {leaked[:10]}"


def test_ansible_doc_shows_the_module_and_filter(installed):
    module = run(installed, "ansible-doc", "-j", f"{FQCN}.vllm_cpu_facts")
    assert module.returncode == 0, module.stderr
    assert "numa_nodes" in json.dumps(json.loads(module.stdout))
    plan = run(installed, "ansible-doc", "-t", "filter", "-j", f"{FQCN}.vllm_cpu_plan")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)[f"{FQCN}.vllm_cpu_plan"]["doc"]["short_description"]


def test_module_and_filter_run_from_the_installed_copy(installed):
    facts = run(installed, "ansible", "localhost", "-m", f"{FQCN}.vllm_cpu_facts", "--check")
    assert facts.returncode == 0, facts.stdout + facts.stderr
    assert "isa_class" in facts.stdout
    release = run(
        installed,
        "ansible",
        "localhost",
        "-m",
        "ansible.builtin.debug",
        "-a",
        f"msg={{{{ '0.32.0' | {FQCN}.vllm_release }}}}",
    )
    assert release.returncode == 0, release.stdout + release.stderr
    assert "torch_version" in release.stdout


def test_playbooks_parse_by_fqcn(installed):
    for playbook in ("site", "upgrade", "facts", "preflight"):
        check = run(installed, "ansible-playbook", "--syntax-check", "-i", "localhost,", f"{FQCN}.{playbook}")
        assert check.returncode == 0, check.stdout + check.stderr
