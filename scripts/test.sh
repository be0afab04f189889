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
# ansible-test wants the collection's real files under ansible_collections/<namespace>/<name>
# (units import the tests as ansible_collections.vllm.cpu_fleet.tests.unit.*): both run on one
# copy of the checkout's files. Sanity runs before collections/ (the checkout's link to itself for
# ansible.cfg: not shipped, it would need a line in the shipped ignore file) is added for the units,
# whose benchmark and entry-point tests run from a checkout's layout.
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
collection="$copy/ansible_collections/vllm/cpu_fleet"
mkdir -p "$collection"
git ls-files -co --exclude-standard -z | grep -zv '^collections/' | tar -c --null -T - -f - | tar -x -C "$collection"
step "ansible-test sanity"
# Every test runs. Those with requirements (pylint, validate-modules, ...) run in
# virtualenvs of their own under ~/.ansible/test/venv, made once and reused: pip
# gets there offline through scripts/bootstrap.sh's stand-in for get-pip.py
# (tools/ansible_test_get_pip.py, in ansible-test's cache), and their pinned
# requirements come from the package index pip is set up for. shellcheck is Debian's.
# The artifact's own sanity (what Galaxy and Automation Hub run) and the modules' Python
# floor are in tests/integration/test_collection_artifact.py.
(cd "$collection" && ANSIBLE_TEST_CONTENT_ROOT="$collection" ansible-test sanity --local --python 3.11 --color no)
step "ansible-test units"
git ls-files -co --exclude-standard -z -- collections | tar -c --null -T - -f - | tar -x -C "$collection"
(cd "$collection" && ANSIBLE_TEST_CONTENT_ROOT="$collection" ansible-test units --local --python 3.11 --color no)
step "pytest (integration)"
# One worker per CPU, each test file on one worker (its module fixtures run once): 11 min serial, 7 min 40 s
# on 2 cores (2026-12-02).
pytest -q -n auto --dist loadfile --durations=25 tests/integration
for scenario in ${MOLECULE_SCENARIOS:-toolchain build_standin loadbalancer serve}; do
  step "molecule test -s $scenario"
  molecule test -s "$scenario" 2>&1 | stamp_phases
done
step "done"
