"""vllm_cpu_facts' addresses subset gives setup's four address facts, in network namespaces built to differ.

Each namespace is a real kernel network stack (veth pairs, a bridge, secondary and labelled addresses, a
point-to-point peer, routes or none): the module and setup run inside it through the ansible CLI, and their
facts must be equal, lists in the same order.
"""

import os
import shutil
import subprocess
import uuid

import pytest
from test_facts_module import run_module

ADDRESS_FACTS = ("default_ipv4", "default_ipv6", "all_ipv4_addresses", "all_ipv6_addresses")

LAYOUTS = {
    # The default route's source is a labelled secondary address; a point-to-point pair; v6 on the same link.
    "secondary-source": [
        "link add v0 type veth peer name v1",
        "link set lo up",
        "link set v0 up",
        "link set v1 up",
        "addr add 10.1.0.2/24 brd + dev v0",
        "addr add 10.1.0.3/24 brd + dev v0",
        "addr add 10.1.0.9/24 dev v0 label v0:web",
        "addr add 10.5.0.1/24 dev v0",
        "addr add 10.9.0.1 peer 10.9.0.2/32 dev v1",
        "addr add fd01::2/64 dev v0 nodad",
        "addr add fd01::3/64 dev v0 nodad",
        "route add default via 10.1.0.1 dev v0 src 10.1.0.9",
        "-6 route add default via fd01::1 dev v0",
    ],
    # The default route leaves through a bridge; a second veth holds the only v6 address.
    "bridge-default": [
        "link add br0 type bridge",
        "link add v2 type veth peer name v3",
        "link set lo up",
        "link set br0 up",
        "link set v2 up",
        "link set v3 up",
        "link set br0 mtu 1300",
        "addr add 172.20.0.5/16 brd + dev br0",
        "addr add 192.168.77.7/24 dev v2",
        "addr add fd02::7/64 dev v3 nodad",
        "route add default via 172.20.0.1",
        "-6 route add default via fd02::1 dev v3",
    ],
    # Addresses but no default route: both defaults are {}.
    "no-route": [
        "link add v4 type veth peer name v5",
        "link set v4 up",
        "addr add 10.4.0.4/24 dev v4",
    ],
    # The source is a point-to-point address: setup reads no prefix (32) and no broadcast for it.
    "peer-source": [
        "link add v6 type veth peer name v7",
        "link set lo up",
        "link set v6 up",
        "addr add 10.6.0.1 peer 10.6.0.2/30 brd + dev v6",
        "route add default via 10.6.0.2 dev v6",
    ],
}


def _ip(*words):
    return subprocess.run(["ip", *words], capture_output=True, text=True, check=False)


@pytest.fixture
def namespace(request):
    """A fresh network namespace with the layout's links, addresses and routes."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.fail("needs root and iproute2's ip to build network namespaces (CI runs as root)")
    name = f"vllm-addr-{uuid.uuid4().hex[:8]}"
    made = _ip("netns", "add", name)
    assert made.returncode == 0, made.stderr
    try:
        for command in LAYOUTS[request.param]:
            done = _ip("-n", name, *command.split())
            assert done.returncode == 0, f"ip -n {name} {command}: {done.stderr}"
        yield name
    finally:
        _ip("netns", "del", name)


def _facts_in(name, module, args):
    _unused, status, result = run_module("-a", args, module=module, inside=("ip", "netns", "exec", name))
    assert status == "SUCCESS", f"{module} in {name}: {result}"
    return {key.removeprefix("ansible_"): value for key, value in result["ansible_facts"].items()}


@pytest.mark.parametrize("namespace", sorted(LAYOUTS), indirect=True)
def test_the_addresses_subset_is_setups_address_facts(namespace):
    theirs = _facts_in(namespace, "setup", "gather_subset=!all,!min,network")
    ours = _facts_in(namespace, "vllm.cpu_fleet.vllm_cpu_facts", "gather_subset=addresses")
    assert {key: ours.get(key) for key in ADDRESS_FACTS} == {key: theirs[key] for key in ADDRESS_FACTS}
    # The subset is those four facts: no interface facts that setup's network subset would add.
    assert "interfaces" not in ours and "default_ipv4" in ours
