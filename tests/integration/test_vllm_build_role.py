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
        timeout=300,
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
            - role: vllm_build
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
            - role: vllm_build
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
            toolchain_facts: {{cc: /usr/bin/gcc-12, cxx: /usr/bin/g++-12, gcc_version: "12.2.0"}}
          roles: [vllm_plan, vllm_build]
        """,
    )
    out = result.stdout
    assert result.returncode != 0
    assert "vLLM 0.32.0 needs gcc >= 12.3 but gcc 12.2.0 was found" in out
    assert "set vllm_build_gcc122_workaround: true" in out
    assert not artifacts.exists() and not (tmp_path / "work").exists()
