#!/usr/bin/env bash
# Converges the demo fleet: local systemd containers described by
# inventories/demo/ (ansible.cfg's default inventory). Re-running it is safe.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
bash scripts/bootstrap.sh
bash scripts/build-images.sh
export PATH="$repo/.venv/bin:$PATH"
ansible-playbook playbooks/demo_fleet.yml
ansible-playbook site.yml "$@"
