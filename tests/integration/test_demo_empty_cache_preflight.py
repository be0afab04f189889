"""The demo inventory's preflight from an empty controller cache: every missing input is named at once, with its
fix, and nothing changes.

A developer's .cache (wheelhouse, oneDNN source, model, certificates) hides a missing install step; this test
gives the demo inventory a cache of its own that is empty. The inventory is copied so that its
``inventory_dir/../../.cache`` is that empty directory; every host is this controller (local connection), which
is all preflight needs: it reads the hosts and the controller's files and changes nothing.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
VLLM_HOSTS = ("demo-vllm-1", "demo-vllm-2")
EVERY_HOST = ("demo-builder", *VLLM_HOSTS, "demo-lb", "demo-mon")


def _tree(root):
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.fixture
def empty_cache_inventory(tmp_path):
    shutil.copytree(REPO / "inventories" / "demo", tmp_path / "inventories" / "demo")
    (tmp_path / ".cache").mkdir()
    return tmp_path


def run_preflight(root, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [
            ANSIBLE_PLAYBOOK,
            "-i",
            str(root / "inventories" / "demo"),
            "--vault-id",
            f"demo@{REPO / 'inventories' / 'demo.vault-password'}",
            str(REPO / "playbooks" / "preflight.yml"),
            "-e",
            "ansible_connection=local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            *extra,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _said(result):
    return " ".join((result.stdout + result.stderr).split())


def _assert_stopped_and_unchanged(result, root, before):
    text = _said(result)
    assert result.returncode != 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert _tree(root) == before, "preflight wrote into the controller cache or the inventory"
    for host in EVERY_HOST:
        assert f"{host} : ok=" in text and "changed=0" in text.split(f"{host} : ok=")[1][:60], (host, text[-2000:])


@pytest.mark.parametrize("route", ["index", "wheel"])
def test_an_empty_cache_names_every_missing_input_and_changes_nothing(empty_cache_inventory, route):
    root = empty_cache_inventory
    cache = f"{root}/inventories/demo/../../.cache"
    before = _tree(root)
    result = run_preflight(root, "-e", f"vllm_install_source={route}")
    _assert_stopped_and_unchanged(result, root, before)
    text = _said(result)
    # The test CA and each host's certificate, read by the inventory's lookups: named, not a raw lookup error.
    assert f"{cache}/tls/ca.crt': File not found" in text
    assert "fix: make what it reads (test certificates: ansible-playbook vllm.cpu_fleet.tls_test_certs" in text
    for host in VLLM_HOSTS:
        assert f"{host}: vllm_service_tls_certificate: cannot be read" in text
        assert f"{cache}/tls/{host}.key': File not found" in text
        # The model the controller generates, and the wheelhouse the hosts install from.
        assert f"{host}: vllm_service_model_path: '{cache}/models/tiny-llama' has no config.json" in text
        assert f"{host}: 'python3' is Python 3." in text and f"but the wheelhouse {cache}/wheelhouse holds vLLM" in text
        # An unreadable value is said once, not again by the checks that saw it empty.
        assert f"{host}: vllm_service_tls_certificate: is empty" not in text
    assert "demo-lb: loadbalancer_tls_certificate: cannot be read" in text
    onednn = f"demo-builder: vllm_build_onednn_tarball: {cache}/sources/onednn_3.7.2+ds.orig.tar.xz is missing"
    torch = f"demo-builder: vllm_build_wheelhouse: {cache}/wheelhouse/cp311 has no torch-"
    # The build inputs are asked for on the source route only, in preflight (not 20 minutes later in the build).
    assert (onednn in text) is (route == "wheel"), text[-3000:]
    assert (torch in text) is (route == "wheel"), text[-3000:]
    if route == "wheel":
        assert "fix: run bash " in text and "/scripts/onednn-source.sh --dest " in text
