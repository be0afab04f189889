"""The patches this repository carries, applied with the role's own command
(`patch -p1 --forward --fuzz=0`) to the real release sdists: the gcc 12.2
workaround on 0.32.0 and 0.33.0, and the 0.32.0 backport the build scenario
and the demo use. The sdists come from the package index once (find_sdist.py,
checked against the release table's sha256) into .cache/sources/."""

import ast
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_cpu_releases import release_info

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / ".cache" / "sources"
WORKAROUND_DIR = REPO / "roles" / "vllm_build" / "files" / "patches"
# Shipped with the role too, picked by vllm_build_shipped_patches (the argument spec's choices).
TRITON_FALLBACK = WORKAROUND_DIR / "vllm-0.32.0" / "01-cpu-triton-fallback-signature.patch"
FILES = [
    "cmake/cpu_extension.cmake",
    "csrc/cpu/sgl-kernels/flash_mla.cpp",
    "vllm/utils/cpu_triton_utils.py",
    "vllm/v1/worker/block_table.py",
]


def _sdist(version):
    path = SOURCES / f"vllm-{version}.tar.gz"
    if not path.exists():
        SOURCES.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                str(REPO / "roles" / "vllm_build" / "files" / "find_sdist.py"),
                "--index",
                "https://pypi.org/simple",
                "--name",
                "vllm",
                "--version",
                version,
                "--sha256",
                release_info(version)["sdist_sha256"],
                "--dest",
                str(SOURCES),
            ],
            check=True,
        )
    return path


def _extract(version, root):
    """The files the patches touch, from the release's sdist, under root."""
    prefix = f"vllm-{version}/"
    with tarfile.open(_sdist(version)) as sdist:
        for name in FILES:
            member = sdist.getmember(prefix + name)
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(sdist.extractfile(member).read())
    return root


@pytest.fixture(params=["0.32.0", "0.33.0"])
def tree(request, tmp_path):
    return request.param, _extract(request.param, tmp_path)


def _patch(tree, patch_file, dry_run=False):
    argv = ["patch", "-p1", "--forward", "--fuzz=0", "--batch", "--no-backup-if-mismatch", "-i", str(patch_file)]
    argv += ["--dry-run"] if dry_run else []
    return subprocess.run(argv, cwd=tree, capture_output=True, text=True, check=False)


def test_gcc122_patches_apply_cleanly_and_change_only_what_they_say(tree):
    version, root = tree
    flash_before = (root / "csrc/cpu/sgl-kernels/flash_mla.cpp").read_text()
    for entry in release_info(version)["gcc_workarounds"]["12.2"]:
        result = _patch(root, WORKAROUND_DIR / entry["patch"])
        assert result.returncode == 0, result.stdout + result.stderr
    cmake = (root / "cmake/cpu_extension.cmake").read_text()
    assert "CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12.2))" in cmake
    assert "VERSION_GREATER_EQUAL 12.3))" not in cmake
    flash = (root / "csrc/cpu/sgl-kernels/flash_mla.cpp").read_text()
    # Only the function template's constant; the entry point's one of the same name stays.
    assert flash.count("static constexpr int64_t kBLOCK_H_MAX = 16;") == 1
    constant = "constexpr int64_t kBLOCK_H_MAX = 16;"
    assert flash.count(constant) == flash_before.count(constant)
    # A second application is refused, as the role's patch step would (it records what it applied instead).
    for entry in release_info(version)["gcc_workarounds"]["12.2"]:
        assert _patch(root, WORKAROUND_DIR / entry["patch"], dry_run=True).returncode != 0


def _params(path, function_name):
    """Parameter names of a function (or a method) defined anywhere in the file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == function_name:
            return [arg.arg for arg in node.args.args]
    raise AssertionError(f"{function_name} not in {path}")


def _kernel_params(root):
    # ComputeSlotMappingKernel.kernel, the Triton kernel the fallback replaces.
    return _params(root / "vllm/v1/worker/block_table.py", "kernel")


def _fallback_params(root):
    return _params(root / "vllm/utils/cpu_triton_utils.py", "_compute_slot_mapping_kernel_impl")


def test_triton_fallback_patch_makes_0_32_take_the_kernels_arguments(tree):
    version, root = tree
    kernel = [name.removesuffix("_ptr") for name in _kernel_params(root)]
    if version == "0.33.0":
        # Fixed upstream: the fallback already matches, and the 0.32.0 patch is not for it.
        assert _fallback_params(root) == kernel
        assert _patch(root, TRITON_FALLBACK, dry_run=True).returncode != 0
        return
    assert _fallback_params(root) != kernel  # the bug the patch is for
    result = _patch(root, TRITON_FALLBACK)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _fallback_params(root) == kernel


# ---- the role finds the patches it ships from itself

SPEC = yaml.safe_load((REPO / "roles" / "vllm_build" / "meta" / "argument_specs.yml").read_text())
SHIPPED_CHOICES = SPEC["argument_specs"]["main"]["options"]["vllm_build_shipped_patches"]["choices"]


def test_every_shipped_patch_is_a_choice_or_the_release_tables():
    on_disk = {str(path.relative_to(WORKAROUND_DIR)) for path in WORKAROUND_DIR.rglob("*.patch")}
    table = {entry["patch"] for version in ("0.31.0", "0.32.0", "0.33.0")
             for entry in release_info(version)["gcc_workarounds"]["12.2"]}  # fmt: skip
    assert table | set(SHIPPED_CHOICES) == on_disk
    assert not table & set(SHIPPED_CHOICES)
    assert str(TRITON_FALLBACK.relative_to(WORKAROUND_DIR)) in SHIPPED_CHOICES


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_the_role_applies_a_shipped_patch_after_the_gcc_workaround(tmp_path, version):
    """roles/vllm_build/tasks/patches.yml with the gcc 12.2 workaround (as build_class.yml sets it) and the shipped
    triton backport picked by name: the role finds both in its own files/patches/, in that order."""
    src = _extract(version, tmp_path / "work" / "src")
    workaround = release_info(version)["gcc_workarounds"]["12.2"]
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
                    vllm_build_workaround_patches: {[{"patch": entry["patch"]} for entry in workaround]}
                    vllm_build_shipped_patches: [vllm-0.32.0/01-cpu-triton-fallback-signature.patch]
                    vllm_build_release: {{version: "{version}"}}
            """
        )
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if version == "0.33.0":  # fixed upstream: the backport does not apply, and the role says which patch
        assert result.returncode != 0
        assert "PATCH DOES NOT APPLY CLEANLY: 03-01-cpu-triton-fallback-signature.patch" in result.stdout
        assert not src.exists()
        return
    assert result.returncode == 0, result.stdout[-3000:]
    record = [line.split()[0] for line in (src / ".vllm-fleet-patches").read_text().split(", ")]
    assert record == [
        "01-01-x86-gcc-check-12.2.patch",
        "02-02-flash-mla-static-constexpr.patch",
        "03-01-cpu-triton-fallback-signature.patch",
    ]
    assert _fallback_params(src) == [name.removesuffix("_ptr") for name in _kernel_params(src)]
