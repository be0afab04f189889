#!/usr/bin/env bash
# Builds the systemd base images the demo fleet and Molecule use, from the
# Debian archive (no container registry is needed). An image that already
# exists is kept; pass --force to rebuild.
set -euo pipefail
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
force=${1:-}
declare -A suites=([12]=bookworm [13]=trixie)
# python3 for Ansible, systemd as PID 1, iproute2 for testinfra's socket checks,
# openssh-server because Ansible reaches the test hosts as it reaches a real
# fleet: SSH with pipelining (a podman exec connection costs ~4x per task).
include=python3,systemd,systemd-sysv,dbus,sudo,iproute2,procps,ca-certificates,apt-utils,openssh-server
# Bump when the image's content changes: an image of another revision is rebuilt.
revision=2

for version in 12 13; do
  image=localhost/vllm-fleet/debian:$version
  if [ "$force" != --force ] && podman image exists "$image" &&
     [ "$(podman image inspect -f '{{ index .Labels "vllm-fleet.revision" }}' "$image")" = "$revision" ]; then
    echo "images: $image present"
    continue
  fi
  suite=${suites[$version]}
  root=$(mktemp -d "/var/tmp/debootstrap-$suite.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  echo "images: debootstrap $suite from $mirror"
  debootstrap --variant=minbase --include="$include" "$suite" "$root" "$mirror" >/dev/null
  # The security suite keeps container packages on the same patch level as the host.
  printf 'deb %s %s main\ndeb %s %s-updates main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
    "$mirror" "$suite" "$mirror" "$suite" "$suite" > "$root/etc/apt/sources.list"
  # Units that cannot work in a container and only slow boot or spam the journal.
  for unit in systemd-remount-fs.service systemd-udevd.service systemd-udev-trigger.service \
              getty.target console-getty.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
  done
  # Every container makes its own SSH host keys at boot, none is baked in.
  rm -f "$root"/etc/ssh/ssh_host_*
  mkdir -p "$root/etc/systemd/system/ssh.service.d"
  printf '[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\nExecStartPre=/usr/sbin/sshd -t\n' \
    > "$root/etc/systemd/system/ssh.service.d/host-keys.conf"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import --quiet \
    --change 'CMD ["/sbin/init"]' --change 'ENV container=podman' \
    --change 'STOPSIGNAL SIGRTMIN+3' --change "LABEL vllm-fleet.revision=$revision" - "$image" >/dev/null
  rm -rf "$root"
  trap - EXIT
  echo "images: built $image"
done
