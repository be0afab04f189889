"""plugin_utils/vllm_container.py: the container mode's units, seccomp profile, environment file and version rules.

Each output is read back the way its reader reads it: the Quadlet file's keys against the release of podman whose
Quadlet first reads them and its Exec= as Quadlet and systemd split it, the podman-run unit by systemd-analyze, the
environment file by a port of podman's own reader, the seccomp profile by what libseccomp would decide for each
syscall with and without CAP_SYS_NICE. The NUMA syscall table is checked against the vLLM sdists where they are.

Golden files (tests/fixtures/container/golden/) hold both unit styles for one recorded plan; regenerate them only
after reading every changed line:  python tests/unit/test_container.py --write
"""

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# conftest makes the collection importable, also when this file runs as a script.
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_container as container
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_planner import plan as make_plan
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_serve import serve_command
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_syntax import SHELL_OWNED
from ansible_collections.vllm.cpu_fleet.tests.conftest import (
    MACHINE_NAMES,
    REPO,
    load_expected_facts,
)
from ansible_collections.vllm.cpu_fleet.tests.unit.test_serve_command import TRICKY, _systemd_split
from hypothesis import given, settings
from hypothesis import strategies as st

ContainerUnitError = container.ContainerUnitError
FIXTURES = REPO / "tests" / "fixtures" / "container"
GOLDEN = FIXTURES / "golden"
PROFILES = {
    "0.50.1": FIXTURES / "seccomp-containers-common-v0.50.1.json",  # Debian 12, podman 4.3.1
    "0.62.3": FIXTURES / "seccomp-containers-common-v0.62.3.json",  # podman 5.4.2 (Debian 13)
}
HOST = "spr-2s-amx"
IMAGE = "localhost/vllm-cpu:0.32.0-x86_64-3f2a9c1d"
IMAGE_ID = "sha256:" + "3f2a9c1d" * 8
VENV = "/opt/vllm/venv"
MODEL = "/var/lib/vllm/models/tiny-llama"
NUMA = ("get_mempolicy", "migrate_pages", "set_mempolicy")
STYLES = {"quadlet-5.4.2": "5.4.2", "podman-run-4.3.1": "4.3.1"}


def _plan(machine=HOST, version="0.32.0", **options):
    return make_plan(load_expected_facts(machine), {"vllm_version": version, "host": machine, **options})


def _serve(instance, extra=(), venv=VENV, distribution="vllm", version="0.32.0"):
    """The command the role's vars/main.yml builds, for the image's venv."""
    args = ["--served-model-name", "tiny-llama", "--host", "10.0.0.5", "--port", str(instance["port"])]
    args += ["--dtype", instance["dtype"], "--block-size", "128", "--middleware", "vllm_service_auth.RequireApiKey"]
    if instance["tp"] > 1:
        args += ["--tensor-parallel-size", str(instance["tp"]), "--distributed-executor-backend", "mp"]
    argv = serve_command(version, distribution, venv, MODEL, [*args, *extra])
    return {"argv": argv}


def _knobs(podman_release="5.4.2", unit_memory=None, **change):
    podman = podman_release
    knobs = {
        "host": HOST,
        "podman_version": f"podman version {podman}",
        "image": IMAGE,
        "image_id": IMAGE_ID,
        "user": 998,
        "group": 998,
        "home": "/var/lib/vllm",
        "model_path": MODEL,
        "read_only_paths": ["/usr/local/lib/vllm-service"],
        "env_file": "/etc/vllm/vllm-1.podman.env",
        "seccomp_profile": "/etc/vllm/seccomp-vllm.json",
        "secrets": {"VLLM_SERVICE_API_KEY": "vllm-api-key"},
        "systemd_version": 257 if podman.startswith("5") else 252,
        "firewall_unit": "vllm-firewall.service",
    }
    if unit_memory:
        knobs.update(memory_high_mib=unit_memory["high_mib"], memory_max_mib=unit_memory["max_mib"])
    knobs.update(change)
    return knobs


def _golden_units(style):
    result = _plan()
    instance = result["instances"][1]
    # shm_mib as set by an inventory: the size the golden files (and podman 5.4.2's Quadlet recording of them) have.
    knobs = _knobs(STYLES[style], result["unit_memory"], shm_mib=256)
    return container.container_unit(instance, _serve(instance), knobs)


def _entries(text):
    """(section, key, value) of a unit file as systemd and Quadlet read it; comments and blank lines dropped."""
    entries, section = [], None
    for line in text.split("\n"):
        if not line.strip() or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line!r}"
        entries.append((section, key, value))
    return entries


def _value(text, section, key):
    (value,) = [v for s, k, v in _entries(text) if s == section and k == key]
    return value


# What Quadlet makes of each [Container] key the units use (pkg/systemd/quadlet/quadlet.go).
QUADLET_FLAG = {
    "ContainerName": "--name={}",
    "Pull": "--pull={}",
    "Network": "--network={}",
    "DropCapability": "--cap-drop={}",
    "AddCapability": "--cap-add={}",
    "SeccompProfile": "--security-opt=seccomp={}",
    "ShmSize": "--shm-size={}",
    "EnvironmentFile": "--env-file={}",
    "Environment": "--env={}",
    "Secret": "--secret={}",
    "Volume": "--volume={}",
    "StopTimeout": "--stop-timeout={}",
    "LogDriver": "--log-driver={}",
}


def _quadlet_flags(text):
    """The podman run flags Quadlet would pass for the file's [Container] keys (but its own: --cidfile ...)."""
    flags, user, group = [], None, None
    for section, key, value in _entries(text):
        if section != "Container" or key in ("Image", "Exec"):
            continue
        if key == "User":
            user = value
        elif key == "Group":
            group = value
        elif key == "PodmanArgs":
            flags += _systemd_split(value)
        elif key in ("NoNewPrivileges", "ReadOnly", "ReadOnlyTmpfs"):
            assert value == "true"
            flag = {"NoNewPrivileges": "--security-opt=no-new-privileges", "ReadOnly": "--read-only"}
            flags.append(flag.get(key, "--read-only-tmpfs=true"))
        else:
            flags.append(QUADLET_FLAG[key].format(value.lower() if "Capability" in key else value))
    if user:
        flags.append(f"--user={user}:{group}")
    return flags


def _exec_start(text, unit="vllm@vllm-1"):
    """The words systemd runs for the last ExecStart= of a unit file: %t and %N as systemd expands them."""
    line = [value for _section, key, value in _entries(text) if key == "ExecStart"][-1]
    line = re.sub(r"%(.)", lambda m: {"%": "%%", "t": "/run", "N": unit}[m[1]], line)
    return _systemd_split(line)


# ------------------------------------------------------------------------------------------------ NUMA syscalls


def test_every_era_makes_the_same_three_syscalls():
    # No era calls mbind or move_pages: vLLM needs get_mempolicy, set_mempolicy and migrate_pages only.
    for era in container.NUMA_SYSCALLS.values():
        assert era["syscalls"] == NUMA
        assert set(era["calls"]) <= set(container.LIBNUMA_SYSCALLS)


@pytest.mark.parametrize("version", list(RELEASES))
def test_every_release_of_the_table_has_its_numa_syscalls(version):
    assert container.numa_syscalls(version) == NUMA


def test_eras_start_where_the_binding_changed():
    assert set(container.NUMA_SYSCALLS) == {"0.13.0", "0.14.0", "0.20.0"}
    assert "numa_get_membind" in container.NUMA_SYSCALLS["0.13.0"]["calls"]
    assert "numa_get_mems_allowed" in container.NUMA_SYSCALLS["0.14.0"]["calls"]
    assert container.numa_syscalls("0.99.0") == NUMA  # a later release reads as the last era


@pytest.mark.parametrize("version", ["0.12.0", "garbage", None])
def test_a_release_before_the_table_is_refused(version):
    with pytest.raises(ContainerUnitError, match=r"^vllm_version: is .*, not a release the container mode knows"):
        container.numa_syscalls(version)


# ------------------------------------------------------------------------------------------------ seccomp


def _profile(version="0.62.3"):
    with open(PROFILES[version], encoding="utf-8") as handle:
        return json.load(handle)


def _actions(profile, syscall, caps=(), arch="amd64"):
    """The actions the profile's rules give ``syscall`` for a container with capabilities ``caps`` (containers/common
    pkg/seccomp: a rule counts when the process has all its included caps and none of its excluded ones, and the
    arch matches; a rule with argument conditions counts as "<action> if <args>"), or {defaultAction} when no rule
    names it."""
    found = set()
    for rule in profile["syscalls"]:
        names = rule.get("names") or [rule.get("name")]
        if syscall not in names:
            continue
        includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
        if not set(includes.get("caps", [])) <= set(caps) or set(excludes.get("caps", [])) & set(caps):
            continue
        if (includes.get("arches") and arch not in includes["arches"]) or arch in excludes.get("arches", []):
            continue
        args = rule.get("args")
        found.add(f"{rule['action']} if {json.dumps(args, sort_keys=True)}" if args else rule["action"])
    return found or {profile["defaultAction"]}


@pytest.mark.parametrize("version", sorted(PROFILES))
def test_podmans_default_denies_migrate_pages_whatever_the_caps(version):
    # The finding: podman's profile is not Docker's. It allows get_mempolicy, set_mempolicy and mbind to everyone
    # and denies migrate_pages and move_pages with EPERM even with CAP_SYS_NICE: vLLM logs
    # "numa_migrate_pages failed. errno: 1" and its pages allocated before the binding stay where they are.
    profile = _profile(version)
    for caps in ((), ("CAP_SYS_NICE",)):
        assert _actions(profile, "migrate_pages", caps) == {"SCMP_ACT_ERRNO"}
        assert _actions(profile, "move_pages", caps) == {"SCMP_ACT_ERRNO"}
        for call in ("get_mempolicy", "set_mempolicy", "mbind"):
            assert _actions(profile, call, caps) == {"SCMP_ACT_ALLOW"}
    assert profile["syscalls"][0]["errnoRet"] == 1 and "migrate_pages" in profile["syscalls"][0]["names"]


@pytest.mark.parametrize("version", sorted(PROFILES))
def test_the_fleets_profile_is_podmans_plus_exactly_migrate_pages(version):
    default = _profile(version)
    before = copy.deepcopy(default)
    profile = container.seccomp_profile(default, container.numa_syscalls("0.32.0"))
    assert default == before  # the input is not changed
    for caps in ((), ("CAP_SYS_NICE",)):
        for call in NUMA:
            assert _actions(profile, call, caps) == {"SCMP_ACT_ALLOW"}
        assert _actions(profile, "move_pages", caps) == {"SCMP_ACT_ERRNO"}  # vLLM does not call it: still denied
        assert _actions(profile, "mbind", caps) == {"SCMP_ACT_ALLOW"}  # podman's own rule, unchanged
    # Every other syscall keeps its rules; the NUMA ones are in the last rule only.
    *rest, ours = profile["syscalls"]
    assert ours == {
        "names": list(NUMA),
        "action": "SCMP_ACT_ALLOW",
        "args": [],
        "comment": container.SECCOMP_COMMENT,
        "includes": {},
        "excludes": {},
    }
    stripped = [{**rule, "names": [n for n in rule["names"] if n not in NUMA]} for rule in default["syscalls"]]
    assert rest == [rule for rule in stripped if rule["names"]]
    assert {**profile, "syscalls": None} == {**default, "syscalls": None}
    changed = {call for call in _all_names(default) if _actions(default, call) != _actions(profile, call)}
    assert changed == {"migrate_pages"}


def _all_names(profile):
    return {name for rule in profile["syscalls"] for name in rule.get("names", [])}


@pytest.mark.skipif(not Path("/usr/share/containers/seccomp.json").exists(), reason="podman's profile is not here")
def test_the_hosts_own_profile():
    with open("/usr/share/containers/seccomp.json", encoding="utf-8") as handle:
        profile = container.seccomp_profile(json.load(handle), NUMA)
    assert all(_actions(profile, call, ()) == {"SCMP_ACT_ALLOW"} for call in NUMA)


SECCOMP = "vllm_service_container_seccomp_profile"
DOCKER_LIKE = {
    # moby's profiles/seccomp/default.json shape: NUMA policy calls allowed only with CAP_SYS_NICE, migrate_pages
    # named nowhere (the default action denies it), a legacy single-name rule.
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 1,
    "syscalls": [
        {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
        {
            "names": ["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"],
            "action": "SCMP_ACT_ALLOW",
            "includes": {"caps": ["CAP_SYS_NICE"]},
        },
        {"name": "set_mempolicy", "action": "SCMP_ACT_ERRNO", "excludes": {"caps": ["CAP_SYS_NICE"]}},
        {"name": "getpid", "action": "SCMP_ACT_ALLOW"},
    ],
}


def test_a_caps_gated_profile_opens_the_calls_without_the_cap():
    assert _actions(DOCKER_LIKE, "get_mempolicy", ()) == {"SCMP_ACT_ERRNO"}
    profile = container.seccomp_profile(DOCKER_LIKE, NUMA)
    for call in NUMA:
        assert _actions(profile, call, ()) == _actions(profile, call, ("CAP_SYS_NICE",)) == {"SCMP_ACT_ALLOW"}
    assert profile["syscalls"][1]["names"] == ["mbind", "set_mempolicy_home_node"]  # the rest stays gated
    assert {"name": "getpid", "action": "SCMP_ACT_ALLOW"} in profile["syscalls"]  # untouched legacy rule
    assert not any(rule.get("name") == "set_mempolicy" for rule in profile["syscalls"])  # emptied: dropped


@pytest.mark.parametrize(
    ("default", "syscalls", "words"),
    [
        ("unconfined", NUMA, "vllm_service_container_seccomp_profile: is 'unconfined', seccomp=unconfined, which"),
        ({**DOCKER_LIKE, "defaultAction": "SCMP_ACT_ALLOW"}, NUMA, f"{SECCOMP}.defaultAction: is 'SCMP_ACT_ALLOW', a"),
        ({**DOCKER_LIKE, "defaultAction": "SCMP_ACT_LOG"}, NUMA, f"{SECCOMP}.defaultAction: is 'SCMP_ACT_LOG', a def"),
        ({"syscalls": []}, NUMA, "vllm_service_container_seccomp_profile.defaultAction: is None, missing; fix:"),
        ({"defaultAction": "SCMP_ACT_ERRNO"}, NUMA, "vllm_service_container_seccomp_profile.syscalls: is None, not a"),
        ([], NUMA, "vllm_service_container_seccomp_profile: is 'list', not a seccomp profile"),
        (DOCKER_LIKE, ["ptrace", "mbind"], "syscalls: is ['ptrace'], not NUMA memory-policy syscalls"),
        (DOCKER_LIKE, [], "syscalls: is [], not a list of syscalls; fix: pass numa_syscalls(vllm_version)"),
        (DOCKER_LIKE, "migrate_pages", "syscalls: is 'migrate_pages', not a list of syscalls"),
    ],
)
def test_a_profile_that_confines_nothing_is_refused(default, syscalls, words):
    with pytest.raises(ContainerUnitError) as err:
        container.seccomp_profile(default, syscalls, host=HOST)
    assert str(err.value).startswith(f"{HOST}: {words}")
    assert "; fix: " in str(err.value)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(PROFILES)),
    st.sets(st.sampled_from(sorted(container.NUMA_SYSCALL_NAMES)), min_size=1),
)
def test_each_requested_call_is_allowed_by_one_unconditional_rule(version, wanted):
    default = _profile(version)
    profile = container.seccomp_profile(default, wanted)
    for call in wanted:
        (rule,) = [rule for rule in profile["syscalls"] if call in rule["names"]]
        assert rule["action"] == "SCMP_ACT_ALLOW" and not rule["includes"] and not rule["excludes"]
        assert not rule["args"]
    for call in _all_names(default) - set(wanted):
        assert _actions(profile, call, ("CAP_SYS_NICE",)) == _actions(default, call, ("CAP_SYS_NICE",))
        assert _actions(profile, call) == _actions(default, call)
    assert profile["defaultAction"] == default["defaultAction"] == "SCMP_ACT_ERRNO"


# ------------------------------------------------------------------------------------------------ podman versions


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("podman version 5.4.2", (5, 4, 2)),
        ("podman version 5.4.2\n", (5, 4, 2)),
        ("4.3.1", (4, 3, 1)),
        ("podman version 4.9.3-dev", (4, 9, 3)),
        ("podman version 5.0.0-rc1", (5, 0, 0)),
        ("podman version 4.4", (4, 4, 0)),
        ("podman 4.6.1", (4, 6, 1)),
    ],
)
def test_podman_version(text, version):
    assert container.podman_version(text) == version


@pytest.mark.parametrize("text", ["", None, "docker version 24.0.7", "podman version x.y", "podman version 5.4 x"])
def test_not_a_podman_version(text):
    with pytest.raises(ContainerUnitError, match=r"^web-1: podman --version: is .*, not a podman version; fix:"):
        container.podman_version(text, host="web-1")
    assert container.podman_version_ok(text) is False


@pytest.mark.parametrize(
    ("text", "ok", "style", "secrets"),
    [
        ("4.3.1", True, "podman-run", "mount"),  # Debian 12
        ("4.4.0", True, "quadlet", "mount"),
        ("4.9.3", True, "quadlet", "mount"),  # Ubuntu 24.04
        ("5.2.5", True, "quadlet", "mount"),
        ("5.3.0", True, "quadlet", "env"),  # podman inspect masks env secrets from here
        ("5.4.2", True, "quadlet", "env"),  # Debian 13
    ],
)
def test_unit_style_follows_podman(text, ok, style, secrets):
    assert container.podman_version_ok(f"podman version {text}") is ok
    assert container.unit_style(text) == style
    assert container.secret_style(text) == secrets


def test_podman_before_43_is_refused():
    assert container.podman_version_ok("podman version 4.2.1") is False
    with pytest.raises(ContainerUnitError, match=r"^web-1: podman --version: is '4.2.1', older than 4.3.0.*; fix: "):
        container.unit_style("4.2.1", host="web-1")


# ------------------------------------------------------------------------------------------------ the units


@pytest.mark.parametrize("style", sorted(STYLES))
def test_golden_units_of_a_recorded_plan(style):
    result = _golden_units(style)
    assert result["style"] == style.rsplit("-", 1)[0]
    for path, text in result["files"].items():
        assert (GOLDEN / style / path.lstrip("/")).read_text(encoding="utf-8") == text, path
    written = {str(p.relative_to(GOLDEN / style)) for p in (GOLDEN / style).rglob("*") if p.is_file()}
    assert written == {path.lstrip("/") for path in result["files"]}


def test_the_quadlet_file_carries_the_plan():
    result = _plan()
    instance = result["instances"][1]
    unit = container.container_unit(instance, _serve(instance), _knobs(unit_memory=result["unit_memory"]))
    assert unit["unit"] == "vllm@vllm-1.service" and unit["container"] == "vllm-vllm-1"
    ((path, text),) = unit["files"].items()
    assert path == "/etc/containers/systemd/vllm@vllm-1.container"
    assert _value(text, "Container", "PodmanArgs") == "--cpuset-cpus=56-111,168-223 --cpuset-mems=1"
    assert _value(text, "Container", "Network") == "host"
    assert _value(text, "Container", "AddCapability") == "SYS_NICE"
    assert _value(text, "Container", "DropCapability") == "ALL"
    assert _value(text, "Container", "SeccompProfile") == "/etc/vllm/seccomp-vllm.json"
    assert _value(text, "Container", "Secret") == "vllm-api-key,type=env,target=VLLM_SERVICE_API_KEY"
    assert f"{MODEL}:{MODEL}:ro" in [v for s, k, v in _entries(text) if k == "Volume"]
    assert _value(text, "Service", "MemoryMax") == f"{result['unit_memory']['max_mib']}M"
    assert _systemd_split(_value(text, "Container", "Exec"))[:3] == ["vllm", "serve", MODEL]
    assert "unconfined" not in text and "privileged" not in text


@pytest.mark.parametrize(
    "podman", ["4.4.0", "4.5.0", "4.6.0", "4.7.0", "4.8.0", "4.9.3", "5.0.0", "5.2.5", "5.3.0", "5.4.2", "4.3.1"]
)
def test_every_podman_gets_the_same_container(podman):
    # A key the host's Quadlet does not read yet becomes its podman run flag in PodmanArgs=: the flags Quadlet
    # passes are the podman-run unit's, for every release from 4.4.
    result = _plan()
    instance = result["instances"][0]
    unit = container.container_unit(instance, _serve(instance), _knobs(podman))
    reference = container.container_unit(instance, _serve(instance), _knobs("4.3.1"))
    version = container.podman_version(podman)
    if unit["style"] == "podman-run":
        text = unit["files"]["/etc/systemd/system/vllm@vllm-0.service.d/instance.conf"]
        assert _exec_start(text, "vllm@vllm-0")[:9] == [
            "/usr/bin/podman", "run", "--cidfile=/run/vllm@vllm-0.cid", "--replace", "--rm", "--cgroups=split",
            "--sdnotify=conmon", "-d", unit["podman_args"][0],
        ]  # fmt: skip
        return
    (text,) = unit["files"].values()
    keys = [key for section, key, _value in _entries(text) if section == "Container"]
    assert all(container.QUADLET_KEYS[key] <= version for key in keys), keys
    flags = _quadlet_flags(text)
    if unit["secret_style"] == reference["secret_style"]:
        assert sorted(flags) == sorted(reference["podman_args"])
    assert sorted(flags) == sorted(unit["podman_args"])
    if version < (4, 7, 0):
        assert "--shm-size=512m" in _systemd_split(_value(text, "Container", "PodmanArgs"))


def test_quadlet_44_passes_newer_keys_as_flags():
    instance = _plan()["instances"][0]
    (text,) = container.container_unit(instance, _serve(instance), _knobs("4.4.0"))["files"].values()
    keys = {key for section, key, _value in _entries(text) if section == "Container"}
    assert not keys & {"Secret", "ShmSize", "StopTimeout", "ReadOnlyTmpfs", "LogDriver", "Pull"}
    args = _systemd_split(_value(text, "Container", "PodmanArgs"))
    assert "--read-only-tmpfs=true" in args and "--stop-timeout=90" in args and "--pull=never" in args
    assert "--secret=vllm-api-key,type=mount,target=VLLM_SERVICE_API_KEY,uid=998,gid=998,mode=0400" in args


# What podman 5.4.2's own Quadlet (Debian 13) made of the golden Quadlet file: `quadlet -dryrun`, recorded in the
# nest container of benchmarks/container_mode.sh (tests/fixtures/container/README.md).
QUADLET_542 = FIXTURES / "quadlet-5.4.2-dryrun" / "vllm@vllm-1.service"
# The podman run flags Quadlet adds of its own (pkg/systemd/quadlet/quadlet.go), and the flags it writes with their
# value as the next word.
QUADLET_OWN = {"--cidfile=/run/vllm@vllm-1.cid", "--replace", "--rm", "--cgroups=split", "--sdnotify=conmon", "-d"}
TAKES_VALUE = {
    "--name", "--log-driver", "--stop-timeout", "--pull", "--shm-size", "--network", "--security-opt", "--cap-drop",
    "--cap-add", "--user", "-v", "--volume", "--env-file", "--env", "--secret", "--cidfile",
}  # fmt: skip


def _podman_flags(words):
    """podman run flags as --flag=value, the spelling of container_unit's podman_args."""
    flags, index = [], 0
    while index < len(words):
        word = words[index]
        if word in TAKES_VALUE:
            word = f"{'--volume' if word == '-v' else word}={words[index + 1]}"
            index += 1
        elif word == "--read-only-tmpfs":
            word = "--read-only-tmpfs=true"
        flags.append(word)
        index += 1
    return flags


def test_podman_542s_quadlet_runs_exactly_the_podman_args():
    # The real generator, not the tests' model of it: the flags it passes are the podman-run unit's (podman_args),
    # plus its own; Exec= reaches podman unchanged after the image; every [Unit] and [Service] line is kept.
    text = QUADLET_542.read_text(encoding="utf-8")
    unit = _golden_units("quadlet-5.4.2")
    argv = _exec_start(text)
    image = argv.index(IMAGE_ID)
    assert argv[:2] == ["/usr/bin/podman", "run"]
    flags = _podman_flags(argv[2:image])
    assert set(flags) >= QUADLET_OWN
    assert sorted(flag for flag in flags if flag not in QUADLET_OWN) == sorted(unit["podman_args"])
    assert argv[image + 1 :] == ["vllm", *_serve(_plan()["instances"][1])["argv"][1:]]
    (source,) = unit["files"].values()
    generated = _entries(text)
    for entry in _entries(source):
        if entry[0] in ("Unit", "Service", "Install"):
            assert entry in generated, entry
    assert ("Service", "Delegate", "yes") in generated and ("Service", "Type", "notify") in generated


def test_before_53_the_key_is_a_file_not_an_environment_variable():
    # podman inspect shows type=env secrets' values before 5.3.0 (containers/podman#23788).
    instance = _plan()["instances"][0]
    unit = container.container_unit(instance, _serve(instance), _knobs("4.9.3"))
    (text,) = unit["files"].values()
    assert unit["secret_style"] == "mount"
    assert _value(text, "Container", "Secret") == (
        "vllm-api-key,type=mount,target=VLLM_SERVICE_API_KEY,uid=998,gid=998,mode=0400"
    )
    assert _value(text, "Container", "Environment") == "VLLM_SERVICE_API_KEY_FILE=/run/secrets/VLLM_SERVICE_API_KEY"


def test_the_podman_run_unit_is_the_venv_layout():
    result = _plan()
    instance = result["instances"][1]
    unit = container.container_unit(instance, _serve(instance), _knobs("4.3.1", result["unit_memory"]))
    template = unit["files"]["/etc/systemd/system/vllm@.service"]
    dropin = unit["files"]["/etc/systemd/system/vllm@vllm-1.service.d/instance.conf"]
    assert _value(template, "Service", "Type") == "notify" and _value(template, "Service", "Delegate") == "yes"
    assert _value(template, "Service", "KillMode") == "mixed"
    argv = _exec_start(dropin)
    image = argv.index(IMAGE_ID)
    assert argv[:3] == ["/usr/bin/podman", "run", "--cidfile=/run/vllm@vllm-1.cid"]
    assert argv[3:image] == ["--replace", "--rm", "--cgroups=split", "--sdnotify=conmon", "-d", *unit["podman_args"]]
    assert argv[image + 1 :] == ["vllm", *_serve(instance)["argv"][1:]]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
# None: no address policy; a list: vllm_service_firewall: systemd's IPAddressDeny=/IPAddressAllow= lines.
@pytest.mark.parametrize("address_allow", [None, ["10.0.0.7", "fd00::/64"]])
def test_systemd_accepts_the_podman_run_units(tmp_path, address_allow):
    instance = _plan()["instances"][1]
    knobs = _knobs("4.3.1", podman="/bin/true", firewall_unit=None, systemd_dir=str(tmp_path))
    knobs["podman_version"] = "4.3.1"
    knobs["address_allow"] = address_allow
    unit = container.container_unit(instance, _serve(instance, TRICKY_WORDS), knobs)
    for path, text in unit["files"].items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    verify = ["systemd-analyze", "verify", str(tmp_path / "vllm@vllm-1.service")]
    result = subprocess.run(verify, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and str(tmp_path) not in result.stderr, result.stderr


# Words a command line carries only quoted or escaped; a lone ; is refused (Quadlet writes it unquoted).
TRICKY_WORDS = ["--x", *[word for word in TRICKY if word != ";"], "50%", "$VLLM_HOST_IP", "a%%b", "%t"]


@pytest.mark.parametrize("podman", ["5.4.2", "4.4.0", "4.3.1"])
def test_exec_gives_vllm_every_word_unchanged(podman):
    instance = _plan()["instances"][0]
    serve = _serve(instance, TRICKY_WORDS)
    unit = container.container_unit(instance, serve, _knobs(podman))
    words = ["vllm", *serve["argv"][1:]]
    if unit["style"] == "quadlet":
        (text,) = unit["files"].values()
        # Quadlet splits Exec= as systemd does and writes the words into ExecStart=, where systemd reads them.
        assert _systemd_split(_value(text, "Container", "Exec")) == words
    else:
        dropin = unit["files"]["/etc/systemd/system/vllm@vllm-0.service.d/instance.conf"]
        argv = _exec_start(dropin, "vllm@vllm-0")
        assert argv[argv.index(IMAGE_ID) + 1 :] == words


exec_words = st.lists(
    st.text(
        alphabet=st.sampled_from(" \t\n#'\"\\$%`;&|<>(){}[]*?~=:@!,+./-_é\u2028abcAZ09")
        | st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")),
        max_size=12,
    ).filter(lambda word: word != ";"),
    max_size=6,
)


@settings(max_examples=80, deadline=None)
@given(exec_words, st.sampled_from(["5.4.2", "4.3.1"]))
def test_any_argument_survives_both_unit_styles(extra, podman):
    instance = _plan()["instances"][0]
    serve = _serve(instance, extra)
    unit = container.container_unit(instance, serve, _knobs(podman))
    words = ["vllm", *serve["argv"][1:]]
    if unit["style"] == "quadlet":
        (text,) = unit["files"].values()
        assert _systemd_split(_value(text, "Container", "Exec")) == words
    else:
        argv = _exec_start(unit["files"]["/etc/systemd/system/vllm@vllm-0.service.d/instance.conf"], "vllm@vllm-0")
        assert argv[argv.index(IMAGE_ID) + 1 :] == words


def test_tensor_parallel_instance_gets_both_nodes_and_a_larger_shm():
    result = _plan(model_size_gib=700)
    (instance,) = result["instances"]
    assert instance["tp"] == 2 and instance["omp_threads_bind"] == "1-55|56-111"
    unit = container.container_unit(instance, _serve(instance), _knobs())
    (text,) = unit["files"].values()
    assert "--cpuset-mems=0,1" in _value(text, "Container", "PodmanArgs")
    # The queues (160 + 2 x 240 + 24 MiB) and 4 MiB per OpenMP thread (55 + 56): 1108, with 64 of headroom 1172,
    # to a multiple of 64.
    assert container.shm_need_mib(instance) == 1108
    assert container.shm_mib(instance) == 1216
    assert _value(text, "Container", "ShmSize") == "1216m"


def test_shm_of_a_single_rank_instance_holds_its_two_queues():
    # Measured on vLLM 0.32.0: a 160 MiB and a 240 MiB file (docs/container-mode.md); 400 + 64 to 512.
    instance = _plan()["instances"][0]
    assert container.shm_need_mib(instance) == 400
    assert container.shm_mib(instance) == 512
    assert container.shm_mib(instance, headroom_mib=0) == 448


def test_shm_of_tp_2_with_one_thread_per_rank_is_what_was_measured():
    # vLLM 0.32.0, TP 2, VLLM_CPU_OMP_THREADS_BIND=0|1: files of 160, 240, 240 and 24 MiB and two 4 MiB buffers.
    assert container.shm_need_mib({"tp": 2, "omp_threads_bind": "0|1"}) == 672


@pytest.mark.parametrize("machine", MACHINE_NAMES)
@pytest.mark.parametrize("version", ["0.13.0", "0.32.0"])
def test_every_recorded_plan_writes_both_styles(machine, version):
    result = _plan(machine, version)
    for instance in result["instances"]:
        for podman in ("5.4.2", "4.3.1"):
            knobs = _knobs(podman, env_file=f"/etc/vllm/{instance['name']}.podman.env")
            unit = container.container_unit(instance, _serve(instance, version=version), knobs)
            assert f"--cpuset-cpus={instance['cpus']}" in unit["podman_args"]
            mems = ",".join(map(str, instance["numa_nodes"]))
            assert f"--cpuset-mems={mems}" in unit["podman_args"]


def test_the_module_form_serves_a_vllm_cpu_image():
    instance = _plan()["instances"][0]
    serve = _serve(instance, distribution="vllm-cpu")
    (text,) = container.container_unit(instance, serve, _knobs())["files"].values()
    words = _systemd_split(_value(text, "Container", "Exec"))
    assert words[:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL]


def _instance_with(**change):
    instance = copy.deepcopy(_plan()["instances"][1])
    instance.update(change)
    return instance


P = f"{HOST}: vllm_plan.instances[vllm-1]"
IMG = f"{HOST}: vllm_service_container_image: is"
IID = f"{HOST}: vllm_service_container_image (the ID podman image inspect gives it): is"
K = f"{HOST}: vllm_service_container"


@pytest.mark.parametrize(
    ("instance", "knobs", "serve_venv", "words"),
    [
        ({"cpus": "56-111\n"}, {}, VENV, f"{P}.cpus: is '56-111\\n', not a kernel cpulist"),
        ({"cpus": "56-111%"}, {}, VENV, f"{P}.cpus: is '56-111%', not a kernel cpulist"),
        ({"cpus": "56-111,x"}, {}, VENV, f"{P}.cpus: is '56-111,x', not a kernel cpulist"),
        ({"numa_nodes": []}, {}, VENV, f"{P}.numa_nodes: is [], not a list of distinct NUMA node numbers"),
        ({"numa_nodes": ["1"]}, {}, VENV, f"{P}.numa_nodes: is ['1'], not a list"),
        ({"numa_nodes": [True]}, {}, VENV, f"{P}.numa_nodes: is [True], not a list"),
        ({"omp_threads_bind": "1-55"}, {}, VENV, f"{P}.omp_threads_bind: is '1-55', binds CPUs 1-55 outside"),
        ({"tp": 2}, {}, VENV, f"{P}.omp_threads_bind: is '57-111', 1 ranks for TP 2"),
        ({"name": "vllm@1"}, {}, VENV, f"{HOST}: vllm_plan.instances[].name: is 'vllm@1', not a name both systemd"),
        ({}, {"model_path": f"{MODEL}\nx"}, VENV, f"{HOST}: vllm_service_model_path: is '{MODEL}\\nx', has "),
        ({}, {"model_path": "/var/lib/vllm/models/50%"}, VENV, f"{HOST}: vllm_service_model_path: is '/var/lib/vl"),
        ({}, {"model_path": "/var/lib/vllm/models/my model"}, VENV, f"{HOST}: vllm_service_model_path: is '/var/l"),
        ({}, {"image": "localhost/vllm cpu:1"}, VENV, f"{IMG} 'localhost/vllm cpu:1',"),
        ({}, {"image": "vllm-cpu:0.32.0"}, VENV, f"{IMG} 'vllm-cpu:0.32.0', not a f"),
        ({}, {"image": "localhost/vllm-cpu"}, VENV, f"{IMG} 'localhost/vllm-cpu', has no"),
        ({}, {"image": "docker.io/vllm/vllm-cpu:1"}, VENV, f"{IMG} 'docker.io/vllm/v"),
        ({}, {"image": "localhost/VLLM:1"}, VENV, f"{IMG} 'localhost/VLLM:1', not a"),
        ({}, {"image": "localhost/vllm-cpu:1%"}, VENV, f"{IMG} 'localhost/vllm-cpu:1%"),
        ({}, {"user": 0}, VENV, f"{HOST}: vllm_service_user (its uid): is 0, not a uid/gid above 0"),
        ({}, {"group": "vllm"}, VENV, f"{HOST}: vllm_service_group (its gid): is 'vllm', not a uid/gid above 0"),
        ({}, {"env_file": "etc/vllm/x.env"}, VENV, f"{HOST}: vllm_service_config_dir: is 'etc/vllm/x.env', not an abs"),
        ({}, {"seccomp_profile": "unconfined"}, VENV, f"{K}_seccomp_profile: is 'unconfi"),
        ({}, {"secrets": {"VLLM_SERVICE_API_KEY": "my key"}}, VENV, f"{K}_secrets[VLLM_"),
        ({}, {"secrets": {"1KEY": "vllm-api-key"}}, VENV, f"{K}_secrets key: is '1KEY', not"),
        ({}, {"shm_mib": 16}, VENV, f"{K}_shm_mib: is 16, not a whole number of MiB from 64"),
        ({}, {"podman_version": "4.2.0"}, VENV, f"{HOST}: podman --version: is '4.2.0', older than 4.3.0"),
        ({}, {"image": None}, VENV, f"{IMG} None, not set; fix:"),
        ({}, {"image_id": ""}, VENV, f"{IID} '', not set; fix:"),
        ({}, {"image_id": "3f2a9c1d"}, VENV, f"{IID} '3f2a9c1d', not a whole image ID"),
        ({}, {"image_id": "sha256:" + "a" * 63}, VENV, f"{IID} 'sha256:{'a' * 63}', not a whole"),
        ({}, {"image_id": "A" * 64}, VENV, f"{IID} '{'A' * 64}', not a whole"),
        ({}, {"image_id": "a" * 64 + "\n"}, VENV, f"{IID} '{'a' * 64}\\n', not a whole"),
        ({}, {"image_id": "sha512:" + "a" * 64}, VENV, f"{IID} 'sha512:{'a' * 64}', not a whole"),
        ({}, {"image_id": IMAGE}, VENV, f"{IID} '{IMAGE}', not a whole"),
        ({}, {"read_only_paths": "/etc/vllm"}, VENV, f"{K}_read_only_paths: is '/etc/vllm"),
        ({}, {"read_only_paths": ["/etc/vllm/tls.crt", "/etc/%"]}, VENV, f"{K}_read_only"),
        ({}, {"stop_timeout": 0}, VENV, f"{HOST}: vllm_service_stop_timeout: is 0, not a whole number from 1"),
        (
            {},
            {"firewall_unit": "vllm firewall"},
            VENV,
            f"{HOST}: vllm_service_firewall: is 'vllm firewall', not a serv",
        ),
        ({}, {"surprise": 1}, VENV, f"{HOST}: knobs: is ['surprise'], not knobs of the container unit"),
        ({}, {}, "/opt/vllm/current", f"{HOST}: vllm_service_command: is '/opt/vllm/current/bin/vllm', not a program"),
        (
            {},
            {"model_path": "/var/lib/vllm/models/other"},
            VENV,
            f"{HOST}: vllm_service_model_path: is '/var/lib/vllm/m",
        ),
    ],
)
def test_bad_input_names_the_variable_and_the_fix(instance, knobs, serve_venv, words):
    planned = _instance_with(**instance)
    serve = _serve(_plan()["instances"][1], venv=serve_venv)
    with pytest.raises(ContainerUnitError) as err:
        container.container_unit(planned, serve, _knobs(**knobs))
    assert str(err.value).startswith(words), str(err.value)
    assert all(problem.startswith(f"{HOST}: ") and "; fix: " in problem for problem in err.value.problems)


def test_every_problem_is_named_at_once():
    with pytest.raises(ContainerUnitError) as err:
        container.container_unit(
            _instance_with(cpus="0-3\n"), _serve(_plan()["instances"][1]), _knobs(image="a b", user=0)
        )
    assert len(err.value.problems) == 3


@pytest.mark.parametrize("extra", [[";"], ["a\rb"], ["nul\x00"], ["bell\x07"]])
def test_words_no_unit_line_carries_are_refused(extra):
    instance = _plan()["instances"][0]
    with pytest.raises(ContainerUnitError, match=rf"^{HOST}: vllm_service_extra_args: is .*; fix: "):
        container.container_unit(instance, _serve(instance, extra), _knobs())


@pytest.mark.parametrize(
    "image",
    [
        IMAGE,
        "registry.example:5000/fleet/vllm-cpu:0.32.0-x86_64-3f2a",
        "localhost/vllm-cpu@sha256:" + "a" * 64,
        "registry.example/vllm-cpu:0.32.0@sha256:" + "0" * 64,
        "localhost:5000/vllm_cpu__x/a-b:V1.2_3",
    ],
)
def test_image_references_of_the_fleets_own_registry(image):
    assert container.image_reference(image) is None


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("given", [IMAGE_ID, IMAGE_ID.removeprefix("sha256:")])
def test_the_units_run_the_image_by_its_id_not_by_its_name(style, given):
    # A name can be given to other bits later (a forced rebuild loaded or pulled under it); the ID cannot, so a
    # restart runs what the unit was written for, and new bits change the file (and so restart through the rollout).
    instance = _plan()["instances"][1]
    unit = container.container_unit(instance, _serve(instance), _knobs(STYLES[style], image_id=given))
    texts = "\n".join(unit["files"].values())
    run = [text for text in unit["files"].values() if "[Container]" in text or "ExecStart=" in text]
    (text,) = run
    if style.startswith("quadlet"):
        assert _value(text, "Container", "Image") == IMAGE_ID
    else:
        argv = _exec_start(text)
        assert argv[argv.index(IMAGE_ID) + 1] == "vllm"
    # The name is only in a comment (for the operator): no word that runs says it.
    assert all(line.startswith("#") for line in texts.splitlines() if IMAGE in line)
    comments = " ".join(line for line in texts.splitlines() if line.startswith("#"))
    assert IMAGE in comments and IMAGE_ID in comments
    other = container.container_unit(instance, _serve(instance), _knobs(STYLES[style], image_id="b" * 64))
    assert other["files"] != unit["files"]


def test_the_api_key_reaches_the_unit_only_by_its_secret_name():
    instance = _plan()["instances"][0]
    for podman in ("5.4.2", "4.3.1"):
        unit = container.container_unit(instance, _serve(instance), _knobs(podman))
        text = "\n".join(unit["files"].values())
        secret_lines = [line for line in text.split("\n") if "VLLM_SERVICE_API_KEY" in line]
        assert secret_lines and all("vllm-api-key" in line for line in secret_lines)
        assert "EnvironmentFile=/etc/vllm/secrets.env" not in text


# ------------------------------------------------------------------------------------------------ env file


def _podman_env(text, environ=None):
    """podman's pkg/env ParseFile (4.3.1 and 5.4.2 alike): lines split at \\n (bufio.ScanLines drops a \\r before
    it), leading blanks and tabs trimmed, # comments and empty lines skipped, NAME=value with the value verbatim,
    a NAME alone copied from podman's environment."""
    env = {}
    for raw in text.split("\n"):
        line = (raw[:-1] if raw.endswith("\r") else raw).lstrip(" \t")
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert key, f"podman refuses {line!r}"
        name = key.lstrip(" \t")
        if sep:
            env[name] = value
        elif name in (environ or {}):
            env[name] = environ[name]
    return env


env_names = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,15}\Z").filter(
    lambda name: name not in SHELL_OWNED and name not in container.SECRET_ENV and name != "PATH"
)
env_values = st.text(
    alphabet=st.sampled_from(" \t#'\"\\$%`;=:é\u2028\x0b\x0c\x85") | st.characters(codec="utf-8"), max_size=24
).filter(lambda value: not re.search(r"[\n\r\x00]", value))


@settings(max_examples=120, deadline=None)
@given(st.dictionaries(env_names, env_values | st.integers(0, 10**6), max_size=6))
def test_the_env_file_reads_back_through_podmans_reader(env):
    text = container.podman_env_file(env, header="Managed by vllm.cpu_fleet\ninstance vllm-0")
    assert _podman_env(text, environ={"HOME": "/root"}) == {name: str(value) for name, value in env.items()}


def test_the_plan_env_of_a_recorded_instance():
    instance = _plan()["instances"][0]
    env = {**instance["env"], "HOME": "/var/lib/vllm", "LD_PRELOAD": "", "VLLM_SERVICE_OPEN_PATHS": "/health /metrics"}
    text = container.podman_env_file(env, header="Managed by vllm.cpu_fleet")
    assert text.split("\n", maxsplit=1)[0] == "# Managed by vllm.cpu_fleet"
    assert "VLLM_CPU_OMP_THREADS_BIND=1-55\n" in text and "LD_PRELOAD=\n" in text
    assert '"' not in text  # podman keeps quotes: none are written
    assert _podman_env(text) == env


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"X": "a\nB=c"}, "web-1: environment[X]: is 'a\\nB=c', has a newline, carriage return or NUL"),
        ({"X": "a\r"}, "web-1: environment[X]: is 'a\\r', has a newline"),
        ({"X": "a\x00"}, "web-1: environment[X]: is 'a\\x00', has a newline"),
        ({"1X": "a"}, "web-1: environment: is '1X', not a variable name"),
        ({"VLLM_SERVICE_API_KEY": "s3cret-value"}, "web-1: environment[VLLM_SERVICE_API_KEY]: is '(not shown)', a key"),
        ({"HF_TOKEN": "hf_s3cret"}, "web-1: environment[HF_TOKEN]: is '(not shown)', a key"),
        ({"PATH": "/usr/bin"}, "web-1: environment[PATH]: is '/usr/bin', the image's PATH finds"),
        ({"X": True}, "web-1: environment[X]: is True, not a string or number"),
        ({"X": ["a"]}, "web-1: environment[X]: is ['a'], not a string or number"),
        ("X=1", "web-1: environment: is 'X=1', not a dict"),
    ],
)
def test_the_env_file_refuses_what_podman_would_read_otherwise(env, words):
    with pytest.raises(ContainerUnitError) as err:
        container.podman_env_file(env, host="web-1")
    assert str(err.value).startswith(words) and "; fix: " in str(err.value)
    assert "s3cret" not in str(err.value)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    for style in STYLES:
        for path, text in _golden_units(style)["files"].items():
            target = GOLDEN / style / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")


# ------------------------------------------------------------------------------------ the systemd firewall


@pytest.mark.parametrize("podman", ["5.4.2", "4.4.0", "4.3.1"])
def test_the_systemd_firewall_is_in_the_container_unit_as_in_the_venv_unit(podman):
    """vllm_service_firewall: systemd writes vllm@.service.j2's address policy into every style's unit (issue 44: the
    container unit had none, so the instance ports, /metrics and /health answered every source)."""
    instance = _plan()["instances"][1]
    sources = ["10.0.0.7", "10.1.0.0/16", "fd00::5"]
    unit = container.container_unit(
        instance, _serve(instance), _knobs(podman, firewall_unit=None, address_allow=sources)
    )
    service = [
        (key, value)
        for path, text in unit["files"].items()
        for section, key, value in _entries(text)
        if section == "Service" and key.startswith("IPAddress")
    ]
    assert service == [("IPAddressDeny", "any"), ("IPAddressAllow", "localhost 10.0.0.7 10.1.0.0/16 fd00::5")]
    venv_template = (REPO / "roles/vllm_service/templates/vllm@.service.j2").read_text()
    # The same policy, the same words: the venv unit writes unit_policy's lines (the vllm_unit_policy filter).
    assert "vllm.cpu_fleet.vllm_unit_policy(" in venv_template and "\n{{ policy.address }}\n" in venv_template
    venv = container.unit_policy("venv", "%i", address_allow=sources)["address"]
    assert [line for line in venv if not line.startswith("#")] == [f"{key}={value}" for key, value in service]


@pytest.mark.parametrize("podman", ["5.4.2", "4.3.1"])
def test_no_address_policy_without_the_systemd_firewall(podman):
    instance = _plan()["instances"][1]
    unit = container.container_unit(instance, _serve(instance), _knobs(podman))
    assert not [text for text in unit["files"].values() if "IPAddress" in text]


@pytest.mark.parametrize(
    "sources", [["any"], ["10.0.0.5/24"], ["host.example"], ["10.0.0.5 10.0.0.6"], ["fe80::1%eth0"], "10.0.0.5", [5]]
)
def test_a_source_systemd_would_misread_is_refused(sources):
    instance = _plan()["instances"][1]
    with pytest.raises(container.ContainerUnitError) as err:
        container.container_unit(instance, _serve(instance), _knobs(firewall_unit=None, address_allow=sources))
    assert "vllm_service_firewall: systemd" in str(err.value)


# ------------------------------------------------------------------------------------ one policy for every style


def _policy_lines(style, **knobs):
    policy = container.unit_policy(style, "%i", **knobs)
    return {block: [line for line in lines if not line.startswith("#")] for block, lines in policy.items()}


@pytest.mark.parametrize("systemd", [0, 252, 254, 257])
@pytest.mark.parametrize("firewall_unit", [None, "vllm-firewall.service"])
def test_every_style_writes_the_same_policy_lines(systemd, firewall_unit):
    """vllm@.service.j2 (venv), the Quadlet file and the podman-run unit take these lines from unit_policy: only
    Description=, the container's longer stop timeout and its TimeoutStartSec= differ."""
    knobs = dict(firewall_unit=firewall_unit, systemd_version=systemd, memory_high_mib=5, memory_max_mib=6)
    venv, quadlet, podman_run = (_policy_lines(style, **knobs) for style in ("venv", "quadlet", "podman-run"))
    assert quadlet == podman_run
    assert venv["unit"][1] == "Description=vLLM OpenAI-compatible server (%i)"
    assert quadlet["unit"][1] == "Description=vLLM OpenAI-compatible server (%i, container)"
    assert venv["unit"][2:] == quadlet["unit"][2:]
    assert ("Requires=vllm-firewall.service" in venv["unit"]) is bool(firewall_unit)
    assert venv["service"][-1] == "TimeoutStopSec=90" and quadlet["service"][-1] == "TimeoutStopSec=120"
    assert venv["service"][:-1] == [line for line in quadlet["service"][:-1] if not line.startswith("TimeoutStart")]
    assert venv["memory"] == quadlet["memory"] == ["MemoryHigh=5M", "MemoryMax=6M"]
    assert venv["address"] == quadlet["address"] == []


def test_the_venv_policy_is_written_as_the_template_wrote_it():
    """Byte for byte what vllm@.service.j2 wrote before the policy had one home (a changed unit restarts every
    instance): the comment names the systemd it saw, and IPAddressAllow= without sources ends in a blank."""
    policy = container.unit_policy("venv", "%i", systemd_version=0, systemd_version_text="< 254", address_allow=[])
    assert policy["service"] == [
        "Restart=always",
        "# systemd < 254 has no RestartSteps=: a fixed pause.",
        "RestartSec=15",
        "TimeoutStopSec=90",
    ]
    assert policy["address"][-1] == "IPAddressAllow=localhost "
    assert policy["memory"] == ["MemoryHigh=NoneM", "MemoryMax=NoneM"]
    assert container.unit_policy("quadlet", "x", address_allow=[])["address"][-1] == "IPAddressAllow=localhost"
    assert container.unit_policy("quadlet", "x")["memory"] == []


def test_a_style_the_unit_has_not_is_refused():
    with pytest.raises(ContainerUnitError) as err:
        container.unit_policy("docker", "%i")
    assert "style: is 'docker', not a style of the vllm@ unit; fix: one of venv, quadlet, podman-run." in str(err.value)
