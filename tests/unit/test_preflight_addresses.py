"""Issue 44 items 3 and 4: the backend address (haproxy.cfg's server lines) and every address list (nftables sets,
systemd's IPAddressAllow=, HAProxy ACLs) are checked in preflight as their destinations read them, by class."""

import ipaddress
import re
import string

import pytest
import yaml
from ansible.errors import AnsibleUndefinedVariable
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible_collections.vllm.cpu_fleet.plugins.action import vllm_preflight as action
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight import checks
from ansible_collections.vllm.cpu_fleet.tests.conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st


def lb_defaults(**changes):
    values = yaml.safe_load((REPO / "roles" / "loadbalancer" / "defaults" / "main.yml").read_text())
    values.update(yaml.safe_load((REPO / "roles" / "vllm_fleet" / "defaults" / "main.yml").read_text()))
    values.update(changes)
    return values


def service_defaults(**changes):
    values = yaml.safe_load((REPO / "roles" / "vllm_service" / "defaults" / "main.yml").read_text())
    values.update(yaml.safe_load((REPO / "roles" / "vllm_fleet" / "defaults" / "main.yml").read_text()))
    values.update(changes)
    return values


def monitoring_defaults(**changes):
    values = yaml.safe_load((REPO / "roles" / "monitoring" / "defaults" / "main.yml").read_text())
    values.update(yaml.safe_load((REPO / "roles" / "vllm_fleet" / "defaults" / "main.yml").read_text()))
    values.update(changes)
    return values


# ---- item 3: the backend address, a word of `server NAME ADDRESS:PORT ssl verify required ...` ----

# What each would make of the server line (the review measured the first three on HAProxy 2.6.12).
HOSTILE_BACKEND_ADDRESSES = [
    "10.0.0.5:8000 #",  # comments out ssl verify required: the key crosses in clear
    "10.0.0.5 backup",  # a backup server, never balanced to while another is up
    "10.0.0.5 weight 0",
    "weight 0",
    "10.0.0.5#",
    "10.0.0.5:9000",  # a port of its own before the role's
    "10.0.0.5\tdisabled",
    "10.0.0.5\n    server evil 192.0.2.66:80",
    "[::1]",
    "[2001:db8::5]:8000",
    "fe80::1%eth0",  # a zone index: not an address HAProxy's server line reads as written
    "fe80::1%eth0 backup",
    "10.0.0.5 ",
    " 10.0.0.5",
    "",
    "10.0.0.256",
    "10.1",  # libc reads it as 10.0.0.1
    "167772165",  # and this as 10.0.0.5
    "vllm_1",
    "-vllm-1",
    "vllm-1.",
    "vllm-1..example.com",
    "ipv4@10.0.0.5",
    "unix@/run/x.sock",
    "10.0.0.5'",
    '10.0.0.5"',
    "10.0.0.5\\",
    "vllm-1.example.com ssl verify none",
    "a" * 64,
    ".".join(["a" * 63] * 4) + "a",
]


@pytest.mark.parametrize("address", HOSTILE_BACKEND_ADDRESSES)
def test_a_backend_address_that_is_no_ip_address_or_dns_name_is_refused_by_the_load_balancer(address):
    problems = checks.loadbalancer("lb", lb_defaults(), {"vllm-1": address, "vllm-2": "10.0.0.6"})
    assert problems == [
        f"lb: ansible_host of vllm-1 (loadbalancer_backend_address_var): is {address!r}, no IP address or DNS name;"
        " HAProxy writes it into the server line as written, where a blank starts another server keyword (backup,"
        " weight 0), a colon a port and a # a comment that drops the server's ssl verify required; fix: set it to"
        " the host's IPv4 or IPv6 address (without brackets or port) or its DNS name."
    ]


def test_the_backend_address_is_named_by_the_variable_the_load_balancer_reads():
    v = lb_defaults(loadbalancer_backend_address_var="demo_address")
    (problem,) = checks.loadbalancer("lb", v, {"vllm-1": "10.0.0.5 backup"})
    assert problem.startswith("lb: demo_address of vllm-1 (loadbalancer_backend_address_var): is '10.0.0.5 backup'")


@pytest.mark.parametrize("address", HOSTILE_BACKEND_ADDRESSES)
def test_a_backend_host_refuses_its_own_address(address):
    assert checks.backend_addresses("vllm-1", "ansible_host", {"vllm-1": address}) != []


GOOD_BACKEND_ADDRESSES = [
    "10.0.0.5",
    "10.88.250.51",
    "10.88.240.11",
    "198.51.100.10",
    "127.0.0.1",
    "::1",
    "2001:db8::5",
    "::ffff:10.0.0.5",
    "vllm-1",
    "vllm-1.fleet.example",
    "VLLM-1.Example.COM",
    "localhost",
    "a" * 63,
]


@pytest.mark.parametrize("address", GOOD_BACKEND_ADDRESSES)
def test_an_ip_address_or_dns_name_passes(address):
    assert checks.loadbalancer("lb", lb_defaults(), {"vllm-1": address}) == []


# Every character but letters, digits, `.` and `-` (and `:` within an IPv6 address) changes what HAProxy reads.
_ADDRESS_CHARS = st.text(alphabet=string.printable + "\u00e9\u0131\x00\x7f", max_size=20)


@settings(max_examples=300, deadline=None)
@given(text=_ADDRESS_CHARS)
def test_an_accepted_backend_address_is_one_address_or_name_and_nothing_else(text):
    if checks.backend_addresses("lb", "ansible_host", {"h": text}):
        return
    try:
        ipaddress.ip_address(text)
    except ValueError:
        assert re.fullmatch(r"[A-Za-z0-9.-]{1,253}", text), text
        assert not text.startswith(("-", ".")) and ".." not in text
    else:
        assert "%" not in text


@settings(max_examples=300, deadline=None)
@given(
    address=st.one_of(
        st.ip_addresses().map(str),
        st.sampled_from(GOOD_BACKEND_ADDRESSES),
    ),
    separator=st.sampled_from([" ", "\t", "#", ":", "\n", "'", '"', "\\", ";", ",", "/", "@", "%", "[", "]"]),
    rest=st.text(alphabet=string.ascii_letters + string.digits + " #:", max_size=12),
)
def test_a_good_address_with_anything_after_a_separator_is_refused(address, separator, rest):
    value = address + separator + rest
    try:
        ipaddress.ip_address(value)
        is_ip = "%" not in value
    except ValueError:
        is_ip = False
    if is_ip:  # `::1` + `:` + `2` is another IPv6 address, which HAProxy reads as one
        return
    assert checks.backend_addresses("lb", "ansible_host", {"h": value}) != [], value


# ---- item 4: every address list, as nftables, systemd and HAProxy read it ----

# The lists and the destinations each reaches (netmask: HAProxy alone, which reads 10.0.0.0/255.0.0.0).
LISTS = {
    "vllm_service_firewall_allow": "service",
    "vllm_service_firewall_loadbalancer_sources": "service",
    "monitoring_sources": "service",
    "loadbalancer_metrics_allow": "loadbalancer",
    "monitoring_ui_allow": "monitoring",
}


def problems_for(name, entries, **changes):
    room = LISTS[name]
    if room == "service":
        return checks.service_sources("h", service_defaults(**{name: entries}, **changes))
    if room == "loadbalancer":
        return checks.loadbalancer("h", lb_defaults(**{name: entries}, **changes))
    return checks.monitoring("h", monitoring_defaults(**{name: entries}, **changes), monitoring_host=True)


HOST_BITS = [
    ("10.9.9.9/0", "0.0.0.0/0"),  # nft loads it as 0.0.0.0/0: everyone
    ("10.0.0.5/24", "10.0.0.0/24"),
    ("192.0.2.7/31", "192.0.2.6/31"),
    ("2001:db8::5/64", "2001:db8::/64"),
    ("::1/0", "::/0"),
]


@pytest.mark.parametrize("name", sorted(LISTS))
@pytest.mark.parametrize(("entry", "meant"), HOST_BITS)
def test_a_network_with_host_bits_set_is_refused_in_every_list(name, entry, meant):
    for opted in (False, True):
        problems = problems_for(name, ["192.0.2.1", entry], vllm_fleet_allow_every_source=opted)
        assert len(problems) == 1, problems
        assert problems[0].startswith(
            f"h: {name}[1]: is {entry!r}, a network with host bits set, which nftables and HAProxy drop without a"
            f" word: it admits {meant}; fix: write {meant} if that network is meant"
        ), problems[0]


@pytest.mark.parametrize("name", sorted(LISTS))
@pytest.mark.parametrize("entry", ["0.0.0.0/0", "::/0"])
def test_every_address_needs_the_opt_in(name, entry):
    assert problems_for(name, [entry]) == [
        f"h: {name}[0]: is {entry!r}, every address (a /0 network); fix: list the networks meant, or set"
        " vllm_fleet_allow_every_source: true to admit everyone on purpose."
    ]
    assert problems_for(name, [entry], vllm_fleet_allow_every_source=True) == []


# What a firewall or ACL would read otherwise: systemd's keywords (any = every address), names nft resolves at load
# time, set syntax, two entries in one, zone indexes, masks nft and systemd do not read, out-of-range prefixes.
HOSTILE_ENTRIES = [
    "any",
    "localhost",
    "link-local",
    "multicast",
    "monitoring",
    "mon-1.example.com",
    "10.0.0.1, 10.0.0.2",
    "10.0.0.1,10.0.0.2",
    "10.0.0.0/24 10.1.0.0/16",
    "10.0.0.1 }",
    "10.0.0.1}; flush ruleset",
    "@sources4",
    "$sources",
    "10.0.0.0-10.0.0.9",
    "10.0.0.*",
    "10.0.0.0/",
    "/24",
    "10.0.0.0/33",
    "2001:db8::/129",
    "10.0.0.0/024",
    "10.0.0.0/+24",
    "10.0.0.0/ 24",
    " 10.0.0.1",
    "10.0.0.1 ",
    "010.0.0.1",
    "10.0.0.256",
    "fe80::1%eth0",
    "fe80::%eth0/64",
    "[2001:db8::1]",
    "10.0.0.1\n",
    "",
    "10.0.0.0/8#",
    "10.0.0.0/0.0.0.255",
]


@pytest.mark.parametrize("name", sorted(LISTS))
def test_garbage_is_refused_in_every_list(name):
    # The whole table per list, each entry beside a good one, even with the opt-in.
    passed = []
    for entry in HOSTILE_ENTRIES:
        problems = problems_for(name, ["192.0.2.1", entry], vllm_fleet_allow_every_source=True)
        if len(problems) != 1 or not problems[0].startswith(f"h: {name}") or "; fix: " not in problems[0]:
            passed.append((entry, problems))
    assert passed == []


@pytest.mark.parametrize("name", [name for name, room in LISTS.items() if room != "loadbalancer"])
@pytest.mark.parametrize("entry", ["10.0.0.0/255.0.0.0", "10.0.0.0/255.255.255.0"])
def test_a_dotted_mask_is_refused_where_nftables_or_systemd_read_the_list(name, entry):
    (problem,) = problems_for(name, [entry])
    assert problem.startswith(f"h: {name}: {entry!r} is no address or network; fix: list addresses or CIDR")


def test_haproxy_reads_a_dotted_mask_but_not_host_bits_nor_one_that_is_no_mask():
    assert problems_for("loadbalancer_metrics_allow", ["10.0.0.0/255.0.0.0"]) == []
    (problem,) = problems_for("loadbalancer_metrics_allow", ["10.1.2.3/255.0.0.0"])
    assert "host bits set" in problem and "it admits 10.0.0.0/8" in problem
    (problem,) = problems_for("loadbalancer_metrics_allow", ["10.0.0.0/255.0.255.0"])
    assert problem.startswith("h: loadbalancer_metrics_allow[0]: is '10.0.0.0/255.0.255.0', a prefix or mask no IPv4")


# Characters nft, systemd and HAProxy read as part of an address or a prefix; anything else means something else.
_NETWORK_TEXT = st.text(alphabet="0123456789abcdefABCDEF.:/% ,x-", max_size=24)


@settings(max_examples=500, deadline=None)
@given(text=_NETWORK_TEXT, opted=st.booleans())
def test_an_accepted_entry_is_a_strict_network_as_written(text, opted):
    v = service_defaults(vllm_service_firewall_allow=[text], vllm_fleet_allow_every_source=opted)
    if checks.service_sources("h", v):
        return
    network = ipaddress.ip_network(text, strict=True)
    assert re.fullmatch(r"[0-9A-Fa-f.:]+(/(0|[1-9][0-9]*))?", text), text
    assert opted or network.prefixlen > 0 or "/" not in text


@settings(max_examples=300, deadline=None)
@given(address=st.ip_addresses(), prefix=st.integers(min_value=0, max_value=128), opted=st.booleans())
def test_a_cidr_passes_exactly_when_it_has_no_host_bits_and_is_not_everyone_unless_asked(address, prefix, opted):
    entry = f"{address}/{prefix}"
    v = service_defaults(vllm_service_firewall_allow=[entry], vllm_fleet_allow_every_source=opted)
    try:
        strict = ipaddress.ip_network(entry, strict=True)
    except ValueError:
        strict = None
    passes = strict is not None and (strict.prefixlen > 0 or opted)
    assert (checks.service_sources("h", v) == []) == passes, entry


def test_the_service_lists_were_not_checked_at_all_before():
    # The review's measurement: `any` reached IPAddressAllow= (every address), garbage reached nft on the host.
    v = service_defaults(vllm_service_firewall_allow=["any"], vllm_service_firewall_loadbalancer_sources=["lb-1; drop"])
    assert checks.service_sources("h", v) == [
        "h: vllm_service_firewall_loadbalancer_sources: 'lb-1; drop' is no address or network; fix: list addresses"
        " or CIDR networks, such as 10.0.5.0/24 or 2001:db8::/64.",
        "h: vllm_service_firewall_allow: 'any' is no address or network; fix: list addresses or CIDR networks, such"
        " as 10.0.5.0/24 or 2001:db8::/64.",
    ]


# ---- values from -e arrive as strings: typed by the argument spec first, then checked ----


def _typed(role, task_vars):
    merged = action.ActionModule._variables(dict({"vllm_fleet_controller_cache": "/srv/cache"}, **task_vars), [])
    templar = Templar(loader=DataLoader(), variables={}).copy_with_new_env(available_variables=merged)
    values, problems, unreadable = action.ActionModule._typed("h", role, merged, templar)
    assert problems + unreadable == []
    return values


def test_extra_vars_strings_are_typed_then_checked():
    # -e vllm_fleet_allow_every_source=false, -e '{"monitoring_sources": ["::/0"], ...}'
    shared = _typed(action.SHARED_ROLE, {"vllm_fleet_allow_every_source": "false", "monitoring_sources": ["::/0"]})
    v = service_defaults(**shared, vllm_service_firewall_allow=["10.0.0.0/8", "any"])
    assert v["vllm_fleet_allow_every_source"] is False
    assert checks.service_sources("h", v) == [
        "h: vllm_service_firewall_allow: 'any' is no address or network; fix: list addresses or CIDR networks, such"
        " as 10.0.5.0/24 or 2001:db8::/64.",
        "h: monitoring_sources[0]: is '::/0', every address (a /0 network); fix: list the networks meant, or set"
        " vllm_fleet_allow_every_source: true to admit everyone on purpose.",
    ]
    # -e vllm_fleet_allow_every_source=yes is the string 'yes': typed, it is the opt-in.
    opted = _typed(action.SHARED_ROLE, {"vllm_fleet_allow_every_source": "yes", "monitoring_sources": ["::/0"]})
    assert checks.service_sources("h", service_defaults(**opted)) == []


class _HostVars(dict):
    """hostvars as the action sees them: a value from facts not gathered yet does not render."""

    def __getitem__(self, host):
        found = dict.__getitem__(self, host)
        return _Vars(found)


class _Vars(dict):
    def get(self, name, default=None):
        value = dict.get(self, name, default)
        if value is _UNDEFINED:
            raise AnsibleUndefinedVariable("'ansible_facts' is undefined")
        return value


_UNDEFINED = object()


def test_the_load_balancer_reads_every_backend_address_that_renders_now():
    task_vars = {
        "groups": {"vllm_hosts": ["v1", "v2", "v3", "v4"], "loadbalancers": ["lb"]},
        "hostvars": _HostVars(
            v1={"demo_address": "10.0.0.5:8000 #"},
            v2={"demo_address": _UNDEFINED},
            v3={},
            v4={"demo_address": "10.0.0.7"},
        ),
    }
    v = lb_defaults(loadbalancer_backend_address_var="demo_address", loadbalancer_backend_group="vllm_hosts")
    # v2's address reads facts not gathered yet (the role's own preflight, after them, checks it); v3 has none and
    # is written by its inventory name.
    assert action.ActionModule._backend_addresses(v, task_vars) == {
        "v1": "10.0.0.5:8000 #",
        "v3": "v3",
        "v4": "10.0.0.7",
    }


def test_a_backend_host_reads_its_own_address_only_where_a_load_balancer_balances_it():
    merged = {"loadbalancer_backend_address_var": "lb_address", "lb_address": "10.0.0.5 backup"}
    templar = Templar(loader=DataLoader(), variables={}).copy_with_new_env(available_variables=merged)
    v = {"vllm_service_loadbalancer_group": "loadbalancers"}
    balanced = {"groups": {"loadbalancers": ["lb"]}}
    assert action.ActionModule._backend_address("v1", merged, templar, balanced, v) == ("lb_address", "10.0.0.5 backup")
    assert action.ActionModule._backend_address("v1", merged, templar, {"groups": {}}, v) is None
    # Without the variable the load balancers write the inventory name.
    assert action.ActionModule._backend_address("v1", {}, templar, balanced, v) == ("ansible_host", "v1")
    # The variable is the first load balancer's (vllm_service_listen_address's default reads it there too).
    merged["demo_address"] = "10.0.0.5"
    named = dict(balanced, hostvars=_HostVars(lb={"loadbalancer_backend_address_var": "demo_address"}))
    assert action.ActionModule._backend_address("v1", merged, templar, named, v) == ("demo_address", "10.0.0.5")


# ---- the repository's own inventories and scenarios still pass ----

_ADDRESS_LINE = re.compile(r"^\s*(?:ansible_host|demo_ip|lb_test_address):\s*([^\s#{]+)\s*$", re.M)
_PODMAN_IP = re.compile(r"--ip=([0-9A-Fa-f.:]+)")
_LIST_LINE = re.compile(
    r"^\s*(vllm_service_firewall_allow|vllm_service_firewall_loadbalancer_sources|monitoring_sources"
    r"|monitoring_ui_allow|loadbalancer_metrics_allow):\s*\[([^\]]*)\]",
    re.M,
)


def _repo_files():
    for top in ("inventories", "molecule"):
        for path in sorted((REPO / top).rglob("*.yml")):
            yield path, path.read_text(encoding="utf-8")


def test_the_repositorys_own_addresses_and_lists_pass():
    addresses, lists = [], []
    for path, text in _repo_files():
        addresses += [(path, match) for match in _ADDRESS_LINE.findall(text) + _PODMAN_IP.findall(text)]
        lists += [(path, name, entries) for name, entries in _LIST_LINE.findall(text)]
    assert len(addresses) >= 20 and lists, (addresses, lists)
    for path, address in addresses:
        assert checks.backend_addresses("h", "ansible_host", {"h": address.strip("'\"")}) == [], path
    for path, name, entries in lists:
        values = [entry.strip().strip("'\"") for entry in entries.split(",") if entry.strip()]
        assert problems_for(name, values) == [], (path, name, values)
