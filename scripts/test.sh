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
# The Molecule scenarios that time nothing under load (toolchain, build_standin, loadbalancer, vllm_install) run one
# after another beside the integration tests, which leave part of the two cores idle; their log is printed when
# both are done. The others (serve: real vLLM under load, timed drains and gates) run alone afterwards, in order.
read -r -a scenarios <<<"${MOLECULE_SCENARIOS:-toolchain build_standin loadbalancer serve}"
beside=() alone=()
for scenario in "${scenarios[@]}"; do
  case "$scenario" in
    toolchain | build_standin | loadbalancer | vllm_install) beside+=("$scenario") ;;
    *) alone+=("$scenario") ;;
  esac
done
beside_log="$units/beside.log"
step "pytest (integration), and beside it molecule test -s ${beside[*]:-(none)}"
(
  set -o pipefail
  for scenario in "${beside[@]}"; do
    step "molecule test -s $scenario (beside the integration tests)"
    molecule test -s "$scenario" 2>&1 | stamp_phases || { echo "molecule test -s $scenario failed"; exit 1; }
  done
) >"$beside_log" 2>&1 &
beside_pid=$!
# One worker per CPU, each test file on one worker (its module fixtures run once).
integration_rc=0
pytest -q -n auto --dist loadfile --durations=25 tests/integration || integration_rc=$?
beside_rc=0
wait "$beside_pid" || beside_rc=$?
step "the scenarios run beside the integration tests (their log)"
cat "$beside_log"
if [ "$integration_rc" -ne 0 ] || [ "$beside_rc" -ne 0 ]; then
  step "failed: pytest (integration) rc $integration_rc, the scenarios beside it rc $beside_rc"
  exit 1
fi
for scenario in "${alone[@]}"; do
  step "molecule test -s $scenario"
  molecule test -s "$scenario" 2>&1 | stamp_phases
done
step "done"
