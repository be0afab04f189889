#!/usr/bin/env bash
# Prepares a Debian 12 controller for the demo and the tests: OS packages,
# the container runtime settings this kind of host needs, and the project's
# virtualenv. Safe to re-run: every step checks before it changes anything.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv="$repo/.venv"

need_pkgs=()
# Debian's shellcheck package serves ansible-test sanity's shellcheck test.
for pkg in podman runc debootstrap uidmap slirp4netns fuse-overlayfs openssh-client iproute2 shellcheck; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need_pkgs+=("$pkg")
done
python3 -c 'import ensurepip, venv' 2>/dev/null || need_pkgs+=(python3-venv)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  echo "bootstrap: installing ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

# crun fails on a cgroup v1/v2 hybrid host ("cgroups in hybrid mode not
# supported") and podman's default ulimits exceed a hard nofile limit of
# 20000, so containers would not start: use runc and explicit ulimits.
conf=/etc/containers/containers.conf
wanted="$repo/molecule/resources/containers.conf"
if ! cmp -s "$wanted" "$conf"; then
  echo "bootstrap: writing $conf"
  install -D -m 0644 "$wanted" "$conf"
fi

# A venv an interrupted run left without pip is made again.
if [ ! -x "$venv/bin/python" ] || [ ! -x "$venv/bin/pip" ]; then
  echo "bootstrap: creating $venv"
  python3 -m venv --clear "$venv"
fi
# requirements.lock pins every package with its sha256 (tools/lock_requirements.py writes it from
# requirements.txt): a file whose bytes are not its pin's stops the install. pip first, by its own pin.
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$repo/requirements.lock" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing the locked Python requirements into $venv"
  grep '^pip==' "$repo/requirements.lock" >"$venv/.pip.lock"
  "$venv/bin/pip" install -q --require-hashes -r "$venv/.pip.lock"
  "$venv/bin/pip" install -q --require-hashes -r "$repo/requirements.lock"
  echo "$want" > "$stamp"
fi

# ansible-test sanity runs each test in a virtualenv of its own (~/.ansible/test/venv) and
# puts pip there with get-pip.py from ci-files.testing.ansible.com, which this machine and CI
# cannot reach, unless that script is in its cache: tools/ansible_test_get_pip.py stands in for
# it (pip from the wheel Python's ensurepip bundles). The tests' pinned requirements
# (ansible_test/_data/requirements/sanity.*.txt) then come from the package index pip is set up for.
get_pip_version=$("$venv/bin/python" -c 'import sys, types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="%d.%d" % sys.version_info[:2]))["pip"])')
get_pip="$HOME/.ansible/test/cache/get_pip_${get_pip_version//./_}.py"
if ! cmp -s "$repo/tools/ansible_test_get_pip.py" "$get_pip"; then
  echo "bootstrap: writing ansible-test's pip bootstrap script $get_pip"
  install -D -m 0644 "$repo/tools/ansible_test_get_pip.py" "$get_pip"
fi

# The key Ansible logs in to the test containers with (Molecule mounts its
# public half as root's authorized_keys); a test fleet's key, not a secret.
key="$repo/.cache/ssh/id_ed25519"
if [ ! -f "$key" ]; then
  echo "bootstrap: making the test fleet's SSH key $key"
  mkdir -p "$(dirname "$key")"
  ssh-keygen -q -t ed25519 -N '' -C vllm-fleet-test -f "$key"
fi

# promtool (alert-rule unit tests, PromQL checks of the dashboard) from the
# distribution's prometheus package, unpacked under .cache/tools: the
# controller runs no Prometheus of its own. Chromium renders the report and
# the console page for the screenshot test.
tools="$repo/.cache/tools"
if [ ! -x "$tools/bin/promtool" ]; then
  echo "bootstrap: unpacking promtool into $tools/bin"
  rm -rf "$tools/prometheus" && mkdir -p "$tools/prometheus" "$tools/bin"
  (cd "$tools" && { apt-get download -qq prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download -qq prometheus; }; })
  dpkg-deb -x "$tools"/prometheus_*.deb "$tools/prometheus"
  rm -f "$tools"/prometheus_*.deb
  ln -sf ../prometheus/usr/bin/promtool "$tools/bin/promtool"
fi
# amtool (Alertmanager's configuration check) the same way.
if [ ! -x "$tools/bin/amtool" ]; then
  echo "bootstrap: unpacking amtool into $tools/bin"
  rm -rf "$tools/alertmanager" && mkdir -p "$tools/alertmanager" "$tools/bin"
  (cd "$tools" && { apt-get download -qq prometheus-alertmanager >/dev/null 2>&1 || { apt-get update -qq && apt-get download -qq prometheus-alertmanager; }; })
  dpkg-deb -x "$tools"/prometheus-alertmanager_*.deb "$tools/alertmanager"
  rm -f "$tools"/prometheus-alertmanager_*.deb
  ln -sf ../alertmanager/usr/bin/amtool "$tools/bin/amtool"
fi
if ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q 'install ok installed'; then
  echo "bootstrap: installing chromium"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
