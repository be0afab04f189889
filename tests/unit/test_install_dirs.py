"""roles/vllm_install/files/install_dirs.py: the active link's target and a directory's install record."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_install" / "files" / "install_dirs.py"


def run(link, venv):
    argv = [sys.executable, str(SCRIPT), str(link), str(venv)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_reads_the_link_target_and_the_record(tmp_path):
    base = tmp_path / "0.32.0-x86_64"
    base.mkdir()
    (base / "vllm-install.json").write_text(json.dumps({"wanted": {"version": "0.32.0"}}))
    (tmp_path / "current").symlink_to(base)
    assert run(tmp_path / "current", base) == {"active": str(base), "record": {"wanted": {"version": "0.32.0"}}}


def test_no_link_no_directory_and_a_broken_record_read_as_empty(tmp_path):
    broken = tmp_path / "0.32.0-x86_64-r00000000"
    broken.mkdir()
    (broken / "vllm-install.json").write_text("{half a record")
    assert run(tmp_path / "current", tmp_path / "missing") == {"active": "", "record": {}}
    assert run(tmp_path / "current", broken) == {"active": "", "record": {}}
