"""roles/vllm_image tasks_from host, after its preflight, through ansible-playbook on the controller (local
connection) with a stand-in podman whose store is a file of `name id` lines (issue 44, item 5).

The host must end with the builder's bits under the name: an image it lacks is brought, one it has with the
manifest's ID is left alone (nothing changed), one it has with other bits (a forced rebuild since) is brought again,
and a registry that serves other bits than the builder's manifest records is refused, naming both IDs, before any
unit names the image. The units then run the image by that ID (roles/vllm_service, tests/unit/test_container.py).

Negative control: VLLM_IMAGE_HOST_REF=<git ref> runs that ref's host.yml instead: on main before this change, the
forced-rebuild cases fail (the host kept its other bits and the run failed instead of bringing the builder's), and
so do the refusals, whose messages did not say which bits the registry served.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
ENV = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_RETRY_FILES_ENABLED="0")
NAME = "localhost/vllm-cpu-fleet/vllm:0.32.0-x86_64-amx-0123456789abcdef"
BUILT = "b1" * 32
OTHER = "0e" * 32
# The store: `name id` lines; load reads the archive's one line; pull reads the registry's.
FAKE_PODMAN = """#!/bin/bash
echo "$*" >> "$FAKE_ROOT/podman.log"
store="$FAKE_ROOT/store"
touch "$store"
case "$1 $2" in
  "image inspect") id=$(awk -v n="$5" '$1 == n {print $2}' "$store"); [ -n "$id" ] || exit 125; echo "$id" ;;
  "image exists") grep -q "^$3 " "$store" ;;
  "load --input") read -r name id < "$3"; grep -v "^$name " "$store" > "$store.new"; echo "$name $id" >> "$store.new"
                  mv "$store.new" "$store" ;;
  pull*) id=$(awk -v n="$2" '$1 == n {print $2}' "$FAKE_ROOT/registry"); [ -n "$id" ] || exit 125
         grep -v "^$2 " "$store" > "$store.new"; echo "$2 $id" >> "$store.new"; mv "$store.new" "$store" ;;
  *) exit 2 ;;
esac
"""


def _tasks(tmp):
    """host.yml's tasks after its preflight and its plan (the test gives vllm_image_host)."""
    ref = os.environ.get("VLLM_IMAGE_HOST_REF")
    path = "roles/vllm_image/tasks/host.yml"
    text = (
        subprocess.run(["git", "show", f"{ref}:{path}"], cwd=REPO, capture_output=True, text=True, check=True).stdout
        if ref
        else (REPO / path).read_text()
    )
    tasks = yaml.safe_load(text)
    assert tasks[0]["name"].startswith("Check podman")
    assert tasks[1]["name"] == "Work out the image this host serves from"
    (tmp / "host_tasks.yml").write_text(yaml.safe_dump(tasks[2:], sort_keys=False))
    return tmp / "host_tasks.yml"


def run(tmp, transfer, store, published, registry=None):
    """One run of the tasks against a store of {name: id}; returns (rc, output, store after, podman log)."""
    (tmp / "bin").mkdir(exist_ok=True)
    (tmp / "bin" / "podman").write_text(FAKE_PODMAN)
    (tmp / "bin" / "podman").chmod(0o755)
    (tmp / "store").write_text("".join(f"{name} {image}\n" for name, image in store.items()))
    (tmp / "registry").write_text("".join(f"{name} {image}\n" for name, image in (registry or {}).items()))
    (tmp / "podman.log").write_text("")
    controller = tmp / "controller"
    controller.mkdir(exist_ok=True)
    (controller / "vllm-image.tar").write_text(f"{NAME} {published}\n")
    (controller / "vllm-image.json").write_text(json.dumps({"reference": NAME, "image_id": published}))
    play = [{
        "hosts": "all", "gather_facts": False,
        "environment": {"PATH": f"{tmp / 'bin'}:{os.environ['PATH']}", "FAKE_ROOT": str(tmp)},
        "vars": {
            "vllm_image_transfer": transfer,
            "vllm_plan": {"build": {"build_class": "x86_64-amx"}},
            "vllm_image_host_dir": str(tmp / "host-archives"),
            "vllm_image_host": {"reference": NAME, "archive": str(controller / "vllm-image.tar"),
                                "manifest": str(controller / "vllm-image.json")},
        },
        "tasks": [{"name": "The role's host tasks", "ansible.builtin.include_tasks": str(_tasks(tmp))},
                  {"name": "Say what it set", "ansible.builtin.debug": {"msg": "set {{ vllm_image_reference }}"}}],
    }]  # fmt: skip
    (tmp / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"hosts": {"web-1": host}}}
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(tmp / "inventory.yml"), str(tmp / "play.yml")],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    after = dict(line.split() for line in (tmp / "store").read_text().splitlines())
    return proc.returncode, proc.stdout + proc.stderr, after, (tmp / "podman.log").read_text()


def _changed(out):
    recap = [line for line in out.splitlines() if line.startswith("web-1") and "changed=" in line]
    return int(recap[-1].split("changed=")[1].split()[0])


@pytest.mark.parametrize("transfer", ["archive", "registry"])
def test_a_host_without_the_image_is_given_the_builders(tmp_path, transfer):
    rc, out, store, log = run(tmp_path, transfer, {}, BUILT, registry={NAME: BUILT})
    assert rc == 0, out
    assert store == {NAME: BUILT}
    assert ("load --input" if transfer == "archive" else f"pull {NAME}") in log
    assert f"set {NAME}" in out


@pytest.mark.parametrize("transfer", ["archive", "registry"])
def test_a_host_with_the_builders_bits_is_left_alone(tmp_path, transfer):
    rc, out, store, log = run(tmp_path, transfer, {NAME: BUILT}, BUILT, registry={NAME: BUILT})
    assert rc == 0, out
    assert store == {NAME: BUILT} and "load" not in log and "pull" not in log
    assert _changed(out) == 0, out


@pytest.mark.parametrize("transfer", ["archive", "registry"])
def test_a_host_with_other_bits_under_the_name_is_given_the_builders(tmp_path, transfer):
    # A forced rebuild since the host was given the name: its copy is other bits.
    rc, out, store, log = run(tmp_path, transfer, {NAME: OTHER}, BUILT, registry={NAME: BUILT})
    assert rc == 0, out
    assert store == {NAME: BUILT}, log


def test_a_registry_serving_other_bits_than_the_builders_is_refused(tmp_path):
    rc, out, _store, _log = run(tmp_path, "registry", {}, BUILT, registry={NAME: OTHER})
    assert rc != 0
    flat = " ".join(out.split())
    assert f"web-1: {NAME} on this host is image {OTHER}" in flat, out
    assert f"records {BUILT}" in flat and "the registry serves other bits under that name" in flat, out
    assert "no unit was changed" in flat and f"set {NAME}" not in out


def test_a_manifest_without_an_image_id_is_refused(tmp_path):
    rc, out, _store, _log = run(tmp_path, "archive", {NAME: BUILT}, "", registry={})
    assert rc != 0
    flat = " ".join(out.split())
    assert "records no image ID" in flat and "fix: build it again (vllm_image_force: true)" in flat, out
