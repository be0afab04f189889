"""build_standin, on the builder: the source, venv and script the compile would use."""

import json
import re

from conftest import PATCHES

testinfra_hosts = ["standin-builder"]

WORK = "/var/lib/vllm-build/0.32.0-x86_64"


def test_builder_source_is_patched_in_order(host):
    record = host.file(f"{WORK}/src/.vllm-fleet-patches").content_string
    assert [entry.split()[0] for entry in record.split(", ")] == PATCHES
    assert "VERSION_GREATER_EQUAL 12.2))" in host.file(f"{WORK}/src/cmake/cpu_extension.cmake").content_string
    flash = host.file(f"{WORK}/src/csrc/cpu/sgl-kernels/flash_mla.cpp").content_string
    assert flash.count("static constexpr int64_t kBLOCK_H_MAX = 16;") == 1
    fallback = host.file(f"{WORK}/src/vllm/utils/cpu_triton_utils.py").content_string
    assert "    block_size: int,\n    slot_mapping" not in fallback


def test_builder_runtime_requirements_have_no_github_url(host):
    text = host.file(f"{WORK}/src/requirements/cpu.txt").content_string
    assert "github.com" not in "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert "dropped by vllm_build" in text


def test_builder_venv_has_the_build_requirements(host):
    pip = host.check_output(f"{WORK}/venv/bin/pip list --format json")
    installed = {p["name"].lower(): p["version"] for p in json.loads(pip)}
    assert installed["torch"] == "2.13.0+cpu"
    for name in ("cmake", "ninja", "setuptools-scm", "setuptools-rust", "packaging", "wheel", "jinja2"):
        assert name in installed, name
    major, minor = (int(x) for x in installed["cmake"].split(".")[:2])
    assert (major, minor) >= (3, 26)
    assert not [name for name in installed if name.startswith("nvidia")]


def test_builder_script_has_the_planned_environment(host, manifest):
    script = host.file(f"{WORK}/build.sh").content_string
    for key, value in manifest["env"].items():
        assert re.search(rf"^export {key}='?{re.escape(str(value))}'?$", script, re.M), key
    assert f"export VLLM_VERSION_OVERRIDE={manifest['wheel_version']}" in script.replace("'", "")
    assert re.search(r"^export FETCHCONTENT_SOURCE_DIR_ONEDNN=", script, re.M)
    assert re.search(r"^export CCACHE_DIR=", script, re.M)
    result = json.loads(host.file(f"{WORK}/result.json").content_string)
    assert result["rc"] == 0 and result["inputs_key"] == manifest["inputs_key"]
    assert "STAND-IN for the compile" in host.file(f"{WORK}/build.log").content_string
