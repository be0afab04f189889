"""roles/vllm_build/templates/build.sh.j2 with a hostile value in every variable that reaches it.

ansible-playbook renders the template with Ansible's own filters (quote, basename, comment), bash -n reads the
script, then bash runs it in a temporary directory: stand-ins for python, pip and ccache on the PATH the script
sets record what they were given (no network, no compile). Each hostile value tries every way out of the place
it is written into (command substitution, backticks, a single or double quote, a line break), each try
touching a file of its own (PWN-<variable>-<n>): none may exist afterwards, and every value must arrive at the
commands and in the environment exactly as written.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
TEMPLATE = REPO / "roles" / "vllm_build" / "templates" / "build.sh.j2"

PLAY = """
- name: Render build.sh as roles/vllm_build does
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Render
      ansible.builtin.template:
        src: {template}
        dest: "{{{{ build_sh }}}}"
        mode: "0755"
"""

# What the stand-ins on the script's PATH record: their arguments and the environment the script exported.
RECORDED_ENV = (
    "MAX_JOBS",
    "VLLM_CPU_AVX512BF16",
    "CMAKE_BUILD_PARALLEL_LEVEL",
    "VLLM_VERSION_OVERRIDE",
    "CMAKE_BUILD_TYPE",
    "CC",
    "CXX",
    "FETCHCONTENT_SOURCE_DIR_ONEDNN",
    "CCACHE_DIR",
    "CCACHE_MAXSIZE",
)
STAND_IN = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["FAKE_CALLS"], "a", encoding="utf-8") as log:
    env = {{name: os.environ.get(name) for name in {RECORDED_ENV!r}}}
    log.write(json.dumps({{"name": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "env": env}}) + "\\n")
"""


def hostile(tag):
    """A value that runs `touch PWN-<tag>-<n>` wherever the template puts it unquoted, in double quotes, in single
    quotes or in a comment (no slash: it is also a file name)."""
    return f"v$(touch PWN-{tag}-1)`touch PWN-{tag}-2`'$(touch PWN-{tag}-3)'\"`touch PWN-{tag}-4`\"\ntouch PWN-{tag}-5 #"


# 12 characters: build.sh takes the first 12 of the oneDNN tarball's sha256.
HOSTILE_SHA = "`touch PWN7`" + "0" * 52
HOSTILE_KEY = "K$(touch PWN-key-1)\ntouch PWN-key-2\nK"


def values(work, stand_in, patch_tag, nice):
    return {
        "vllm_build_release": {"version": hostile("release")},
        "vllm_build_class": hostile("class"),
        "vllm_build_dir": str(work),
        "vllm_build_ccache_dir": "/var/cache/" + hostile("ccache"),
        "vllm_build_rust_frontend": False,
        "vllm_build_env": {"MAX_JOBS": hostile("jobs"), "VLLM_CPU_AVX512BF16": hostile("env"), HOSTILE_KEY: "1"},
        "vllm_build_patch_tag": patch_tag,
        "vllm_build_cmake_build_type": hostile("cmake"),
        "vllm_build_toolchain": {"cc": hostile("cc"), "cxx": hostile("cxx")},
        "vllm_build_onednn_tarball": "/controller/onednn.tar.xz",
        "vllm_build_onednn_sha256": HOSTILE_SHA,
        "vllm_build_ccache_max_size": hostile("ccachesize"),
        "vllm_build_stand_in_wheel": f"/controller/wheels/{hostile('standin')}.whl" if stand_in else "",
        "vllm_build_nice": nice,
        "vllm_build_inputs_key": hostile("key"),
    }


def render(tmp_path, variables, build_sh):
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(template=TEMPLATE))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(dict(variables, build_sh=str(build_sh))))
    result = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
         "-e", f"@{extra}", str(play)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(not shutil.which("flock"), reason="build.sh takes its lock with flock (util-linux)")
@pytest.mark.parametrize(
    ("stand_in", "patch_tag", "nice"),
    [
        pytest.param(True, hostile("tag"), 10, id="stand-in-patched"),
        pytest.param(True, "", 10, id="stand-in"),
        pytest.param(False, hostile("tag"), 10, id="compile"),
        pytest.param(False, "", "1$(touch PWN-nice-1)`touch PWN-nice-2`", id="compile-hostile-nice"),
    ],
)
def test_no_value_runs_as_a_command_and_each_arrives_as_written(tmp_path, stand_in, patch_tag, nice):
    work = tmp_path / f"work {hostile('dir')}"
    for directory in (work / "src", work / "venv" / "bin"):
        directory.mkdir(parents=True)
    for name in ("python", "pip", "ccache"):
        (work / "venv" / "bin" / name).write_text(STAND_IN)
        (work / "venv" / "bin" / name).chmod(0o755)
    build_sh = tmp_path / "build.sh"
    v = values(work, stand_in, patch_tag, nice)
    render(tmp_path, v, build_sh)

    syntax = subprocess.run(["bash", "-n", str(build_sh)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr
    calls_log = tmp_path / "calls.jsonl"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "FAKE_CALLS": str(calls_log), "LC_ALL": "C.UTF-8"}
    run = subprocess.run(
        ["bash", str(build_sh)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    log = (work / "build.log").read_text(errors="replace") if (work / "build.log").exists() else ""

    ran = sorted({path.name for path in tmp_path.rglob("PWN*")})
    assert ran == [], f"values ran as commands: {ran}\n--- build.log\n{log}\n--- stderr\n{run.stderr}"

    # The script ran to its end and said what it built, with the values as written.
    assert (work / "build.done").exists(), run.stderr
    release, klass = v["vllm_build_release"]["version"], v["vllm_build_class"]
    assert f"vllm_build: vLLM {release}, class {klass}, MAX_JOBS={v['vllm_build_env']['MAX_JOBS']}, CC=" in log, log
    # A build variable that is no name is refused by export (preflight refuses it first), not run.
    assert "not a valid identifier" in run.stderr, run.stderr
    calls = [json.loads(line) for line in calls_log.read_text().splitlines()] if calls_log.exists() else []
    tools = [call for call in calls if call["name"] in ("python", "pip")]
    if stand_in:
        version = f"{release}+cpu.{patch_tag}" if patch_tag else f"{release}+cpu"
        wheel = f"{hostile('standin')}.whl"
        assert f"vllm_build: STAND-IN for the compile: {wheel}\n" in log, log
        expected_argv = [f"{work}/restamp_wheel.py", f"{work}/stand-in/{wheel}", "vllm", version, f"{work}/dist"]
        assert [call["argv"] for call in tools] == [expected_argv]
    elif isinstance(nice, int):
        assert [call["argv"] for call in tools] == [
            ["wheel", "-v", "--no-build-isolation", "--no-deps", "--wheel-dir", f"{work}/dist", "."]
        ]
    else:
        assert tools == [], tools  # nice refuses the adjustment: nothing runs
        assert not (work / "result.json").read_text().startswith('{"rc": 0,')
    for call in tools:
        assert call["env"] == {
            "MAX_JOBS": v["vllm_build_env"]["MAX_JOBS"],
            "VLLM_CPU_AVX512BF16": v["vllm_build_env"]["VLLM_CPU_AVX512BF16"],
            "CMAKE_BUILD_PARALLEL_LEVEL": v["vllm_build_env"]["MAX_JOBS"],
            "VLLM_VERSION_OVERRIDE": f"{release}+cpu.{patch_tag}" if patch_tag else None,
            "CMAKE_BUILD_TYPE": v["vllm_build_cmake_build_type"],
            "CC": v["vllm_build_toolchain"]["cc"],
            "CXX": v["vllm_build_toolchain"]["cxx"],
            "FETCHCONTENT_SOURCE_DIR_ONEDNN": f"{work}/onednn-{HOSTILE_SHA[:12]}",
            "CCACHE_DIR": v["vllm_build_ccache_dir"],
            "CCACHE_MAXSIZE": v["vllm_build_ccache_max_size"],
        }
    # The inputs key comes back out of result.json as written (the role compares it with the next run's).
    assert (work / "result.json").read_text().endswith(f'"inputs_key": "{v["vllm_build_inputs_key"]}"}}\n')
