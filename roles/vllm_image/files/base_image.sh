#!/bin/sh
# The image's base, made from the Debian archive as the test harness
# makes its images: debootstrap's minbase with the packages vLLM needs at
# run time, imported into podman. No registry is asked for anything.
#   base_image.sh <suite> <mirror> <image name> <packages, comma-separated> <work root>
set -eu
suite=$1 mirror=$2 image=$3 packages=$4 work=$5
mkdir -p "$work"
root=$(mktemp -d "$work/debootstrap-$suite.XXXXXX")
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >/dev/null
# Nothing of the build machine or of apt's downloads stays in the base.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/etc/machine-id
: > "$root/etc/machine-id"
tar -C "$root" -c . | podman import --quiet --change 'LABEL vllm-cpu-fleet.base=debootstrap' - "$image" >/dev/null
echo "built $image from $suite ($mirror)"
