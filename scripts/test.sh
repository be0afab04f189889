#!/usr/bin/env bash
# The whole test suite: lint, unit and integration tests, Molecule scenarios.
# Sets up everything it needs first (scripts/bootstrap.sh, base images).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
bash scripts/bootstrap.sh
bash scripts/build-images.sh
export PATH="$repo/.venv/bin:$PATH"

step() { printf '\n==> %s\n' "$*"; }

step "yamllint"
yamllint --strict .
step "ansible-lint (production profile)"
ansible-lint --offline
step "ruff"
ruff check .
step "pytest"
pytest -q tests
for scenario in ${MOLECULE_SCENARIOS:-toolchain build_standin loadbalancer serve}; do
  step "molecule test -s $scenario"
  molecule test -s "$scenario"
done
