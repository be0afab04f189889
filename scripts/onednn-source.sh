#!/usr/bin/env bash
# Obtain the oneDNN source vLLM's CPU build compiles, ONCE, into .cache/sources/
# of the current directory ($PWD: where vllm_build_onednn_tarball's default,
# vllm_fleet_controller_cache/sources, reads when ansible-playbook runs from the
# same directory) or --dest DIR, for builders that cannot reach GitHub (vLLM's
# CMake otherwise clones oneDNN with FetchContent). Source: Debian trixie's `onednn` source package (3.7.2),
# fetched with a private apt configuration (the machine's apt sources are not
# touched), then pinned by sha256. vLLM 0.32.0 pins oneDNN 3.13; 3.7.2 compiled
# and served bf16/fp32 on this project's test machines, int8 paths untested.
#
#   bash scripts/onednn-source.sh                 # .cache/sources/onednn_3.7.2+ds.orig.tar.xz
#   bash scripts/onednn-source.sh --dest /srv/sources   # another directory (ONEDNN_DEST too)
#   ONEDNN_MIRROR=http://mirror.example/debian bash scripts/onednn-source.sh
#   ONEDNN_SHA256=<sha256> bash scripts/onednn-source.sh   # pin another file
#
# From an installed collection, name the script by its path there
# (<collections path>/ansible_collections/vllm/cpu_fleet/scripts/onednn-source.sh);
# the vllm_build role's fix message prints it.
#
# Prints the tarball path and its sha256: set vllm_build_onednn_tarball and
# vllm_build_onednn_sha256 (roles/vllm_build/defaults/main.yml) to them.
# A re-run with the file present and its sha256 right exits without network.
set -euo pipefail

dest="${ONEDNN_DEST:-$PWD/.cache/sources}"
mirror="${ONEDNN_MIRROR:-http://deb.debian.org/debian}"
suite="${ONEDNN_SUITE:-trixie}"
version="${ONEDNN_VERSION:-3.7.2+ds}"
file="onednn_${version}.orig.tar.xz"
# The file Debian trixie publishes; change both together.
sha256="${ONEDNN_SHA256:-0cc51ca26c1af6a2bb1e71e378e7046f3ceb3e71791ee9d4e246d50f904a6ea6}"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dest) [ $# -ge 2 ] || { echo "onednn-source.sh: --dest needs a directory" >&2; usage 2; }; dest="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "onednn-source.sh: unknown argument $1" >&2; usage 2 ;;
  esac
done

mkdir -p "$dest"
exec 9>"$dest/.onednn.lock"
flock 9

check() { [ -f "$dest/$file" ] && echo "$sha256  $dest/$file" | sha256sum -c --status; }
if check; then
  echo "onednn-source: $dest/$file is up to date (sha256 $sha256)"
  exit 0
fi

work="$(mktemp -d)"
chmod 755 "$work"  # apt downloads as user _apt
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/src"
chmod 777 "$work/src"
echo "deb-src $mirror $suite main" >"$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work" -o "Dir::Cache::archives=$work/archives"
  -o "APT::Get::Only-Source=true" -o "Acquire::Languages=none")
echo "onednn-source: reading $suite's source index from $mirror"
apt-get "${apt_opts[@]}" -qq update
# apt checks the files against the suite's signed index (the keyring of the controller's apt).
(cd "$work/src" && apt-get "${apt_opts[@]}" -qq source --download-only "onednn/$suite")
[ -f "$work/src/$file" ] || { echo "onednn-source: $suite has no $file (found: $(ls "$work/src"))" >&2; exit 1; }
got="$(sha256sum "$work/src/$file" | cut -d' ' -f1)"
if [ "$got" != "$sha256" ]; then
  echo "onednn-source: $file has sha256 $got, expected $sha256; if the mirror is right, re-run with ONEDNN_SHA256=$got" >&2
  exit 1
fi
mv "$work/src/$file" "$dest/$file"
echo "onednn-source: $dest/$file (sha256 $sha256)"
