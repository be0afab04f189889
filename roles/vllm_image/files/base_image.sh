#!/bin/sh
# The image's base, made from the Debian archive as the test harness
# makes its images: debootstrap's minbase with the packages vLLM needs at
# run time, brought up to the suite's -updates and -security of today,
# imported into podman. No registry is asked for anything.
#   base_image.sh <suite> <mirror> <security mirror> <image name> <packages, comma-separated> <work root>
# Every file is checked against the archive's signed Release with the
# builder's Debian archive keyring (refused without it: no unsigned base).
set -eu
suite=$1 mirror=$2 security=$3 image=$4 packages=$5 work=$6
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
if [ ! -s "$keyring" ]; then
  echo "base_image.sh: $keyring is missing (package debian-archive-keyring): the base would be unsigned; nothing is built" >&2
  exit 2
fi
mkdir -p "$work"
root=$(mktemp -d "$work/debootstrap-$suite.XXXXXX")
cleanup() {
  umount "$root/proc" 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT
debootstrap --variant=minbase --keyring="$keyring" --force-check-gpg --include="$packages" \
  "$suite" "$root" "$mirror" >/dev/null
# The suite, its -updates and its -security, each signed by the same keyring.
rm -f "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
mount -t proc proc "$root/proc"
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -q -o APT::Sandbox::User=root update >/dev/null
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o APT::Sandbox::User=root -o Dpkg::Options::=--force-confold \
  full-upgrade >/dev/null
# What the base is made of, as one digest: the image's manifest records it.
# shellcheck disable=SC2016 # dpkg-query's own format, not the shell's
digest=$(chroot "$root" dpkg-query -W -f '${Package}=${Version}\n' | LC_ALL=C sort | sha256sum | cut -d' ' -f1)
umount "$root/proc"
# Nothing of the build machine or of apt's downloads stays in the base.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
  "$root"/etc/machine-id
: >"$root/etc/machine-id"
tar -C "$root" -c . | podman import --quiet --change 'LABEL vllm-cpu-fleet.base=debootstrap' \
  --change "LABEL vllm-cpu-fleet.base-packages=$digest" - "$image" >/dev/null
echo "built $image from $suite, $suite-updates ($mirror) and $suite-security ($security): packages sha256 $digest"
