"""vllm_build role inputs, run through ansible-playbook --check on localhost (no build)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def run(tmp_path, body):
    playbook = tmp_path / "play.yml"
    playbook.write_text(textwrap.dedent(body))
    interpreter = f"ansible_python_interpreter={sys.executable}"
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "--check", "-i", "localhost,", "-c", "local", "-e", interpreter, str(playbook)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [("vllm_build_gcc122_workaround", "maybe"), ("vllm_build_source", "ftp"), ("vllm_build_poll_interval", "soon")],
)
def test_bad_input_is_refused_before_any_task(tmp_path, variable, value):
    result = run(
        tmp_path,
        f"""\
        - hosts: localhost
          gather_facts: false
          roles:
            - role: vllm.cpu_fleet.vllm_build
              vars: {{vllm_version: "0.32.0", {variable}: {value!r}}}
        """,
    )
    assert result.returncode != 0
    assert variable in result.stdout + result.stderr


def test_without_a_plan_the_role_names_the_fix(tmp_path):
    result = run(
        tmp_path,
        """\
        - hosts: localhost
          gather_facts: false
          roles:
            - role: vllm.cpu_fleet.vllm_build
              vars: {vllm_version: "0.32.0"}
        """,
    )
    assert result.returncode != 0
    assert "localhost: vllm_plan or vllm_build_version is missing; run the vllm_plan role" in result.stdout


def test_gcc122_without_the_opt_in_stops_in_preflight(tmp_path):
    artifacts = tmp_path / "artifacts"
    result = run(
        tmp_path,
        f"""\
        - hosts: localhost
          gather_facts: false
          vars:
            vllm_version: "0.32.0"
            vllm_build_artifacts_dir: {str(artifacts)!r}
            vllm_build_work_root: {str(tmp_path / "work")!r}
            # No controller inputs for preflight to ask for: the compiler is what stops this run.
            vllm_build_onednn_tarball: ""
            vllm_build_torch_source: index
            toolchain_facts: {{cc: /usr/bin/gcc-12, cxx: /usr/bin/g++-12, gcc_version: "12.2.0"}}
          roles: [vllm.cpu_fleet.vllm_plan, vllm.cpu_fleet.vllm_build]
        """,
    )
    out = result.stdout
    assert result.returncode != 0
    assert "vLLM 0.32.0 needs gcc >= 12.3 but gcc 12.2.0 was found" in out
    assert "set vllm_build_gcc122_workaround: true" in out
    assert not artifacts.exists() and not (tmp_path / "work").exists()


def run_patches(tmp_path, patches):
    """roles/vllm_build/tasks/patches.yml on a stand-in source tree under tmp_path/work/src."""
    playbook = tmp_path / "patches.yml"
    playbook.write_text(
        textwrap.dedent(
            f"""\
            - hosts: localhost
              gather_facts: false
              tasks:
                - ansible.builtin.include_role:
                    name: vllm.cpu_fleet.vllm_build
                    tasks_from: patches
                  vars:
                    vllm_build_dir: {tmp_path / "work"}
                    vllm_build_patches: {[str(p) for p in patches]}
                    vllm_build_release: {{version: "0.32.0"}}
            """
        )
    )
    interpreter = f"ansible_python_interpreter={sys.executable}"
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", interpreter, str(playbook)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300, check=False,
    )


def make_source(tmp_path):
    src = tmp_path / "work" / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "kernel.cpp").write_text("int block = 16;\nint heads = 8;\n")
    return src


def write_patch(path, old, new):
    path.write_text(f"--- a/kernel.cpp\n+++ b/kernel.cpp\n@@ -1,2 +1,2 @@\n{old}{new}")
    return path


def test_patches_apply_in_order_once_and_are_recorded(tmp_path):
    src = make_source(tmp_path)
    first = write_patch(tmp_path / "backport.patch", "-int block = 16;\n", "+int block = 32;\n int heads = 8;\n")
    # Applies only on top of the first one.
    second = write_patch(tmp_path / "fix.patch", " int block = 32;\n-int heads = 8;\n", "+int heads = 4;\n")
    result = run_patches(tmp_path, [first, second])
    assert result.returncode == 0, result.stdout[-2000:]
    assert (src / "kernel.cpp").read_text() == "int block = 32;\nint heads = 4;\n"
    record = (src / ".vllm-fleet-patches").read_text().split(", ")
    assert [line.split()[0] for line in record] == ["01-backport.patch", "02-fix.patch"]
    assert "changed=0" not in result.stdout
    again = run_patches(tmp_path, [first, second])
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-2000:]


def test_a_patch_that_does_not_apply_is_refused_by_name(tmp_path):
    src = make_source(tmp_path)
    stale = write_patch(tmp_path / "stale.patch", "-int block = 64;\n", "+int block = 128;\n int heads = 8;\n")
    result = run_patches(tmp_path, [stale])
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "vllm_build_patches: PATCH DOES NOT APPLY CLEANLY: 01-stale.patch" in output
    assert "Fix: rebase that patch" in output
    assert not src.exists(), "the half-patched tree must be removed"
