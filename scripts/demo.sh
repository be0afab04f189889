#!/usr/bin/env bash
# Converges the demo fleet: local systemd containers described by
# inventories/demo/ (ansible.cfg's default inventory). Re-running it is safe.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
bash scripts/bootstrap.sh
bash scripts/build-images.sh
export PATH="$repo/.venv/bin:$PATH"
# The demo inventory's vault identity (its password is committed: it guards
# nothing real). Only this script uses it; ansible.cfg names no default.
demo_vault=(--vault-id demo@inventories/demo.vault-password)
ansible-playbook "${demo_vault[@]}" playbooks/demo_fleet.yml
ansible-playbook "${demo_vault[@]}" site.yml "$@"
lb=$(podman inspect -f '{{.NetworkSettings.IPAddress}}' demo-lb 2>/dev/null || true)
if [ -n "$lb" ]; then
    echo "The fleet answers at https://$lb:8080 (CA: $repo/.cache/tls/ca.crt; see the README's curl)."
fi
