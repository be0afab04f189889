#!/usr/bin/env bash
# The whole test suite: lint, unit and integration tests, Molecule scenarios.
# Sets up everything it needs first (scripts/bootstrap.sh, base images).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
bash scripts/bootstrap.sh
bash scripts/build-images.sh
export PATH="$repo/.venv/bin:$repo/.cache/tools/bin:$PATH"

# Each step and each Molecule phase carries the wall clock and the seconds since the start, so that a
# run's log says where its time went (the CI budget is 75 minutes).
step() { printf '\n==> [%s, %d s in] %s\n' "$(date -u +%T)" "$SECONDS" "$*"; }
stamp_phases() { awk -v start="$(date +%s)" -v base="$SECONDS" \
  '/(Executing|Executed)/ && /➜/ { printf "[%s, %d s in] ", strftime("%H:%M:%S", systime(), 1), base + systime() - start } { print; fflush() }'; }

step "yamllint"
yamllint --strict .
step "ansible-lint (production profile)"
ansible-lint --offline
step "ruff"
ruff check .
step "ansible-test sanity"
# ansible-test wants the collection under ansible_collections/<namespace>/<name>:
# the checkout's link collections/ansible_collections/vllm/cpu_fleet is that path.
# Every test runs. Those with requirements (pylint, validate-modules, ...) run in
# virtualenvs of their own under ~/.ansible/test/venv, made once and reused: pip
# gets there offline through scripts/bootstrap.sh's stand-in for get-pip.py
# (tools/ansible_test_get_pip.py, in ansible-test's cache), and their pinned
# requirements come from the package index pip is set up for. shellcheck is Debian's.
collection="$repo/collections/ansible_collections/vllm/cpu_fleet"
(cd "$collection" && ANSIBLE_TEST_CONTENT_ROOT="$collection" ansible-test sanity --local --python 3.11 --color no)
step "ansible-test units"
# ansible-test imports the tests as ansible_collections.vllm.cpu_fleet.tests.unit.*
# and wants their real paths under ansible_collections/: a copy of the checkout's
# files, since the link in collections/ resolves back to the checkout.
units=$(mktemp -d)
trap 'rm -rf "$units"' EXIT
mkdir -p "$units/ansible_collections/vllm/cpu_fleet"
git ls-files -co --exclude-standard -z | tar -c --null -T - -f - | tar -x -C "$units/ansible_collections/vllm/cpu_fleet"
(cd "$units/ansible_collections/vllm/cpu_fleet" \
  && ANSIBLE_TEST_CONTENT_ROOT="$PWD" ansible-test units --local --python 3.11 --color no)
step "pytest (integration)"
# One worker per CPU, each test file on one worker (its module fixtures run once): 11 min serial, 7 min 40 s
# on 2 cores (2026-12-02).
pytest -q -n auto --dist loadfile --durations=25 tests/integration
for scenario in ${MOLECULE_SCENARIOS:-toolchain build_standin loadbalancer serve}; do
  step "molecule test -s $scenario"
  molecule test -s "$scenario" 2>&1 | stamp_phases
done
step "done"
