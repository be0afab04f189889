"""Write a wheelhouse whose `vllm` is the stand-in server (tools/standin_vllm/server.py), for the fleet scenario.

Usage: standin_wheelhouse.py --dest DIR --vllm VERSION [--python 3.11]

The layout and manifest are scripts/wheelhouse.sh's (DIR/<cpXY>/vllm-VERSION.json, the deps bundle, the wheel),
written by the same manifest step, so the vllm_install role installs the stand-in through its own wheelhouse
route, unchanged. The set, all py3-none-any:
  vllm-VERSION        the stand-in (`vllm serve` and the module form), needing torch and uvicorn;
  torch-PIN           metadata and a torch module saying PIN and CUDA None (what the install check reads), and,
                      on x86_64, an empty libiomp5.so in the venv's lib/ (the units preload it there);
  uvicorn, h11, click the server's real dependencies, downloaded once from the package index.
Nothing of it is vLLM: the scenario's docs say so. Re-running with the same inputs writes nothing.
"""

import argparse
import base64
import hashlib
import io
import os
import platform
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVER = Path(__file__).resolve().parent / "standin_vllm" / "server.py"
# The stand-in server's dependencies: pure-Python wheels, pinned.
SERVER_DEPS = {"uvicorn": "0.32.1", "h11": "0.14.0", "click": "8.1.7"}
FORMAT = "standin-1"


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel(path, dist, version, files, requires=(), entry_points=""):
    """A py3-none-any wheel of `files` ({archive name: bytes}); same inputs, same bytes (fixed timestamps)."""
    info = f"{dist}-{version}.dist-info"
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {dist}",
        f"Version: {version}",
        "Summary: stand-in for the fleet scenario (not the real package)",
    ]
    meta += [f"Requires-Dist: {req}" for req in requires]
    files = dict(files)
    files[f"{info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: standin_wheelhouse\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if entry_points:
        files[f"{info}/entry_points.txt"] = entry_points.encode()
    record = [_record_line(name, data) for name, data in sorted(files.items())] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in sorted(files.items()):
            entry = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, data)
    data = buffer.getvalue()
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)


def file_digest(directory, name, version):
    """sha256 of the one wheel of name==version in directory."""
    (found,) = [f for f in directory.glob("*.whl") if f.name.startswith(f"{name.replace('-', '_')}-{version}-")]
    return hashlib.sha256(found.read_bytes()).hexdigest()


def vllm_files(version):
    init = f'"""Stand-in vLLM {version} (tools/standin_vllm): not vLLM."""\n__version__ = "{version}"\n'
    main = (
        "import sys\n\nfrom vllm import __version__\nfrom vllm._standin_server import serve\n\n\n"
        "def main():\n"
        "    if len(sys.argv) < 2 or sys.argv[1] != 'serve':\n"
        "        sys.exit('vllm stand-in: only `vllm serve` is here')\n"
        "    serve(sys.argv[2:], __version__)\n"
    )
    module_form = (
        "import sys\n\nfrom vllm import __version__\nfrom vllm._standin_server import serve\n\n"
        "if __name__ == '__main__':\n    serve(sys.argv[1:], __version__)\n"
    )
    return {
        "vllm/__init__.py": init.encode(),
        "vllm/_standin_server.py": SERVER.read_bytes(),
        "vllm/entrypoints/__init__.py": b"",
        "vllm/entrypoints/cli/__init__.py": b"",
        "vllm/entrypoints/cli/main.py": main.encode(),
        "vllm/entrypoints/openai/__init__.py": b"",
        "vllm/entrypoints/openai/api_server.py": module_form.encode(),
    }


def empty_library(arch):
    """An empty shared library for libiomp5.so (x86_64 units preload it; nothing calls it)."""
    if arch != "x86_64":
        return {}
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "libiomp5.so")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", out, "-x", "c", "/dev/null"], check=True)
        return {"lib/libiomp5.so": Path(out).read_bytes()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", required=True, type=Path)
    parser.add_argument("--vllm", required=True, help="the release the stand-in says it is")
    parser.add_argument("--python", default="3.11")
    args = parser.parse_args()
    arch = platform.machine()
    tag = "cp" + args.python.replace(".", "")
    directory = args.dest / tag
    directory.mkdir(parents=True, exist_ok=True)
    steps = [sys.executable, str(REPO / "scripts" / "wheelhouse.py")]
    pin = subprocess.run(
        [*steps, "torch-pin", args.vllm, arch], check=True, capture_output=True, text=True
    ).stdout.strip()
    torch_version = pin.removeprefix("torch==")
    torch_data = {f"torch-{torch_version}.data/data/{name}": data for name, data in empty_library(arch).items()}
    torch_init = (
        f'"""Stand-in torch: its version only."""\nimport types\n\n__version__ = "{torch_version}"\n'
        "version = types.SimpleNamespace(cuda=None)\n"
    )
    wheel(
        directory / f"torch-{torch_version}-py3-none-any.whl",
        "torch",
        torch_version,
        {"torch/__init__.py": torch_init.encode(), **torch_data},
    )
    wheel(
        directory / f"vllm-{args.vllm}-py3-none-any.whl",
        "vllm",
        args.vllm,
        vllm_files(args.vllm),
        requires=[f"torch=={torch_version}", *(f"{n}=={v}" for n, v in SERVER_DEPS.items())],
        entry_points="[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n",
    )
    missing = [f"{n}=={v}" for n, v in SERVER_DEPS.items() if not list(directory.glob(f"{n}-{v}-*.whl"))]
    if missing:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary",
                ":all:",
                "-d",
                str(directory),
                *missing,
            ],
            check=True,
        )
    # The manifest step takes a hash-pinned lock: the stand-in's own wheels and the server's few
    # dependencies as this controller's index gave them (a test fixture, not a reviewed lock).
    lock = directory / f".standin-{args.vllm}.lock"
    pins = [("vllm", args.vllm), ("torch", torch_version), *SERVER_DEPS.items()]
    lock.write_text("".join(f"{n}=={v} --hash=sha256:{file_digest(directory, n, v)}\n" for n, v in pins))
    manifest = directory / f"vllm-{args.vllm}.json"
    key = hashlib.sha256(f"{FORMAT} {args.vllm} {torch_version} {SERVER.read_bytes()!r}".encode()).hexdigest()[:16]
    glibc = platform.libc_ver()[1] or "2.17"
    platform_tag = f"manylinux_{glibc.replace('.', '_')}_{arch}"
    subprocess.run(
        [
            *steps,
            "manifest",
            str(directory),
            str(manifest),
            str(lock),
            "vllm",
            args.vllm,
            args.python,
            tag,
            platform_tag,
            arch,
            "",
            key,
            f"torch=={torch_version}",
        ],
        check=True,
    )
    files = subprocess.run(
        [*steps, "bundle-files", str(manifest)], check=True, capture_output=True, text=True
    ).stdout.split()
    bundle = directory / f"vllm-{args.vllm}-deps.tar"
    subprocess.run(
        ["tar", "-C", str(directory), "--mtime=2026-01-01", "--owner=0", "--group=0", "-cf", f"{bundle}.tmp", *files],
        check=True,
    )
    if bundle.exists() and bundle.read_bytes() == Path(f"{bundle}.tmp").read_bytes():
        os.remove(f"{bundle}.tmp")
        print(f"standin wheelhouse: {manifest} up to date")
    else:
        os.replace(f"{bundle}.tmp", bundle)
        print(f"standin wheelhouse: wrote {manifest} and {bundle}")


if __name__ == "__main__":
    main()
