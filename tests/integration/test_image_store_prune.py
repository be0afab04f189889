"""roles/vllm_image tasks_from=prune_store through ansible-playbook, on the controller (local connection): the
controller's store and a builder's work root keep vllm_image_keep images per build class and every image a host of
the run is given, the builder's podman (this machine's, under a registry name of the test's own) keeps
vllm_image_keep of the fleet's images, and nothing goes in a run that leaves a vLLM host out (a --limit run).

Negative control: VLLM_PRUNE_STORE_TASKS=<a tasks file> runs that file instead of the role's prune_store."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
KEY = "0123456789abcdef"
VERSIONS = ("0.29.0", "0.30.0", "0.31.0", "0.32.0")
# A registry no other test or scenario names: the images are this test's own.
REGISTRY = "localhost:5999"
REPOSITORY = f"{REGISTRY}/vllm-cpu-fleet/vllm"


@pytest.fixture
def builder_images(tmp_path):
    """The fleet's x86_64 images of every version in this machine's podman (empty, imported); removed after."""
    empty = tmp_path / "empty.tar"
    subprocess.run(["tar", "-cf", str(empty), "--files-from", "/dev/null"], check=True)
    references = [f"{REPOSITORY}:{_tag(version)}" for version in VERSIONS]
    for reference in references:
        subprocess.run(["podman", "import", "-q", str(empty), reference], check=True, capture_output=True)
    yield references
    subprocess.run(["podman", "rmi", "--ignore", *references], check=False, capture_output=True)


def _podman_has(references):
    listed = subprocess.run(["podman", "images", "--format", "json"], check=True, capture_output=True, text=True)
    names = {name for image in json.loads(listed.stdout) for name in image.get("Names") or []}
    return sorted(reference.rsplit(":", 1)[1][:6] for reference in references if reference in names)


def _tag(version, build_class="x86_64"):
    return f"{version}-{build_class}-{KEY}"


def _fill(store, work_root):
    for mtime, version in enumerate(VERSIONS, start=1):
        for build_class in ("x86_64", "avx2"):
            tag = _tag(version, build_class)
            for ext in ("tar", "json"):
                path = store / build_class / f"vllm-image-{tag}.{ext}"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(tag)
                os.utime(path, (mtime * 1000, mtime * 1000))
        archive = work_root / _tag(version) / f"vllm-image-{_tag(version)}.tar"
        archive.parent.mkdir(parents=True, exist_ok=True)
        archive.write_text("archive")
        os.utime(archive, (mtime * 1000, mtime * 1000))
    (store / "x86_64" / "README").write_text("not an image")


def _run(tmp_path, limit=None):
    store, work_root = tmp_path / "images", tmp_path / "work"
    _fill(store, work_root)
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "all": {
            "vars": {**common, "vllm_image_store": str(store), "vllm_image_keep": 2, "vllm_image_registry": REGISTRY},
            "children": {
                # Two container hosts on 0.32.0 (one given it, one running it); a venv host names no image.
                "vllm_hosts": {
                    "hosts": {
                        "c1": {"vllm_image_reference": f"{REPOSITORY}:{_tag('0.32.0')}"},
                        "c2": {"vllm_image_reference": f"{REPOSITORY}:{_tag('0.29.0', 'avx2')}"},
                        "v1": {},
                    }
                },
                "builders": {"hosts": {"b1": {"vllm_image_work_root": str(work_root)}}},
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    tasks = os.environ.get("VLLM_PRUNE_STORE_TASKS")
    step = (
        {"ansible.builtin.include_tasks": tasks}
        if tasks
        else {"ansible.builtin.include_role": {"name": "vllm.cpu_fleet.vllm_image", "tasks_from": "prune_store"}}
    )
    play = [{"hosts": "vllm_hosts", "gather_facts": False, "tasks": [step]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    argv = [ANSIBLE_PLAYBOOK, "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml")]
    result = subprocess.run(
        [*argv, *(["--limit", limit] if limit else [])],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_NOCOLOR="1"),
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and p.parent != tmp_path)
    return left, result.stdout


def _store(versions, build_class):
    names = (f"vllm-image-{_tag(v, build_class)}.{ext}" for v in versions for ext in ("json", "tar"))
    return [f"images/{build_class}/{name}" for name in names]


def test_the_store_and_the_builder_keep_the_newest_and_what_the_run_uses(tmp_path, builder_images):
    left, _out = _run(tmp_path)
    # The builder's podman: 0.32.0 (c1's) and the newest other, 0.31.0, of keep 2 in all.
    assert _podman_has(builder_images) == ["0.31.0", "0.32.0"]
    # x86_64: 0.32.0 (c1's) and the next newest, 0.31.0; avx2: 0.29.0 (c2's) and the newest, 0.32.0.
    wanted = [
        "images/x86_64/README",
        *_store(("0.31.0", "0.32.0"), "x86_64"),
        *_store(("0.29.0", "0.32.0"), "avx2"),
        # The builder's work root holds x86_64 archives only: 0.32.0 and 0.31.0 stay, with their directories.
        *(f"work/{_tag(v)}/vllm-image-{_tag(v)}.tar" for v in ("0.31.0", "0.32.0")),
    ]
    assert left == sorted(wanted)
    assert not (tmp_path / "work" / _tag("0.29.0")).exists()


def test_a_limited_run_removes_nothing(tmp_path, builder_images):
    left, out = _run(tmp_path, limit="c1,c2")
    assert _podman_has(builder_images) == list(VERSIONS)
    assert len([p for p in left if p.startswith("images/")]) == 17
    assert len([p for p in left if p.startswith("work/")]) == 4
    assert "skipping" in out
