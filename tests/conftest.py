import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Tests import the collection's Python by the name Ansible gives it,
# ansible_collections.vllm.cpu_fleet.plugins.<type>.<name>: collections/ holds the
# link ansible_collections/vllm/cpu_fleet -> this checkout.
sys.path.insert(0, str(REPO / "collections"))


# ---- load balancer stand-ins (tests/integration with a fake socat) ---------


def state_helper_args(directory):
    """-e arguments for the loadbalancer role's state save (backend_state.yml): the repository's helper (a real load
    balancer has it installed by the role) and a state file under directory. With a fake socat there is no admin
    socket at loadbalancer_admin_socket, so the helper says so and writes nothing."""
    helper = REPO / "roles" / "loadbalancer" / "files" / "haproxy_server_state.py"
    return ["-e", f"loadbalancer_haproxy_state_helper={helper}",
            "-e", f"loadbalancer_haproxy_state_file={directory}/server-state"]  # fmt: skip


# ---- fact module fixtures (owner: hardware facts) -------------------------
MACHINES = REPO / "tests" / "fixtures" / "machines"
sys.path.insert(0, str(MACHINES))
import expand  # noqa: E402

MACHINE_NAMES = expand.machine_names()


def load_expected_facts(name):
    """Return the hand-checked vllm_cpu fact dict of recorded machine ``name``."""
    with open(MACHINES / name / "expected_facts.json", encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture
def machine_root(tmp_path):
    """Return a function name -> Path expanding that recorded machine's tree.

    Usage: ``root = machine_root("spr-2s-amx")``; each name expands once per test.
    """
    roots = {}

    def _expand(name):
        if name not in roots:
            roots[name] = expand.expand(name, tmp_path / "machines" / name)
        return roots[name]

    return _expand


# ---- end fact module fixtures ----------------------------------------------
