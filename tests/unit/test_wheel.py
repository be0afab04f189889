"""One rule for vLLM wheel file names (plugins/plugin_utils/vllm_cpu_wheel.py): the build
role finds and prunes its wheel with it, the install role picks the wheel of its version."""

import re

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_wheel import select_wheels, wheel_pattern

ERAS = ["0.13.0", "0.17.0", "0.20.1", "0.32.0", "0.33.0"]


@pytest.mark.parametrize("version", ERAS)
def test_the_wheels_the_build_makes_match_and_nothing_else(version):
    pattern = wheel_pattern(version)
    tags = "cp38-abi3-linux_x86_64"
    for name in (f"vllm-{version}+cpu-{tags}.whl", f"vllm-{version}+cpu.p1a2b3c4d-{tags}.whl",
                 f"vllm-{version}-cp38-abi3-linux_aarch64.whl", f"vllm-{version}+cpu-1-{tags}.whl"):  # fmt: skip
        assert re.match(pattern, name), name
    for name in (f"vllm-{version}.json", f"vllm-{version}1+cpu-cp38-abi3-linux_x86_64.whl",
                 f"vllm_cpu-{version}-cp38-abi3-manylinux_2_28_x86_64.whl", f"vllm-{version}+cpu.whl",
                 f"vllm-{version}+cpu_avx-cp38-abi3-linux_x86_64.whl", f"xvllm-{version}-cp38-abi3-linux_x86_64.whl",
                 "vllm-0.99.0+cpu-cp38-abi3-linux_x86_64.whl"):  # fmt: skip
        assert not re.match(pattern, name), name


def test_every_release_has_a_pattern_and_a_v_prefix_is_the_same_release():
    for version in RELEASES:
        assert wheel_pattern(f"v{version}") == wheel_pattern(version)


def test_select_keeps_the_version_s_wheels_in_order():
    paths = [
        "/store/x86_64/vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl",
        "/store/x86_64/vllm-0.33.0+cpu-cp38-abi3-linux_x86_64.whl",
        "/store/vllm-0.32.0.json",
        "/store/vllm-0.32.0-cp38-abi3-linux_x86_64.whl",
    ]
    assert select_wheels(paths, "0.32.0") == [paths[0], paths[3]]
    assert select_wheels(paths, "0.13.0") == []
    assert select_wheels([], "0.32.0") == []


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: wheel_pattern("0.32"), "version: '0.32' is not a vLLM version X.Y.Z; fix: pass the release table's"),
        (lambda: wheel_pattern(None), "version: None is not a vLLM version X.Y.Z; fix:"),
        (lambda: wheel_pattern("0.32.0/../x"), "version: '0.32.0/../x' is not a vLLM version X.Y.Z; fix:"),
        (
            lambda: select_wheels("/store/vllm-0.32.0-x.whl", "0.32.0"),
            "paths: is a string, not a list of file paths; fix:",
        ),
        (lambda: select_wheels(None, "0.32.0"), "paths: is null, not a list of file paths; fix:"),
    ],
)
def test_bad_input_names_the_variable_and_the_fix(call, words):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value).startswith(words)
