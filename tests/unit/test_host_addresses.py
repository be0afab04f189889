"""The rtnetlink reader of the addresses subset: its parsing and setup's rules, on messages built here.

tests/integration/test_host_addresses.py compares the whole subset with setup's in real network namespaces;
these cover what those cannot make: IPv6 temporary addresses, route types, broken and error answers.
"""

import socket
import struct

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.module_utils import vllm_host_addresses as addr
from ansible_collections.vllm.cpu_fleet.plugins.modules import vllm_cpu_facts


def _attribute(kind, data):
    length = 4 + len(data)
    return struct.pack("=HH", length, kind) + data + b"\0" * (-length % 4)


def _message(kind, payload):
    return struct.pack("=LHHLL", 16 + len(payload), kind, 0, 1, 0) + payload + b"\0" * (-len(payload) % 4)


def _route(family, kind=addr.RTN_UNICAST, **attributes):
    header = struct.pack("=BBBBBBBBL", family, 32, 0, 0, 254, 0, 0, kind, 0)
    return header + b"".join(_attribute(code, data) for code, data in attributes.values())


def _ip(family, text):
    return socket.inet_pton(family, text)


def _address(family, index, prefix, flags=0, **attributes):
    header = struct.pack("=BBBBL", family, prefix, flags, 0, index)
    return header + b"".join(_attribute(code, data) for code, data in attributes.values())


def test_a_unicast_route_gives_setups_interface_address_and_gateway():
    payload = _route(
        socket.AF_INET,
        oif=(addr.RTA_OIF, struct.pack("=I", 7)),
        src=(addr.RTA_PREFSRC, _ip(socket.AF_INET, "10.0.0.5")),
        via=(addr.RTA_GATEWAY, _ip(socket.AF_INET, "10.0.0.1")),
    )
    route = addr.parse_route(socket.AF_INET, payload, index_name={7: "eth7"}.__getitem__)
    assert route == {"interface": "eth7", "address": "10.0.0.5", "gateway": "10.0.0.1"}


def test_a_route_of_another_type_or_through_the_probe_itself_gives_no_such_fact():
    unreachable = _route(socket.AF_INET6, kind=7, oif=(addr.RTA_OIF, struct.pack("=I", 1)))
    assert addr.parse_route(socket.AF_INET6, unreachable) == {}
    # setup skips a "via" that names the probed address; an unknown index prints as ip prints it.
    via_probe = (addr.RTA_GATEWAY, _ip(socket.AF_INET, "8.8.8.8"))
    probe = _route(socket.AF_INET, via=via_probe, oif=(addr.RTA_OIF, struct.pack("=I", 99)))

    def unknown(index):
        raise OSError("no interface")

    assert addr.parse_route(socket.AF_INET, probe, index_name=unknown) == {"interface": "if99"}


def test_an_error_answer_and_a_truncated_message_are_netlink_errors():
    with pytest.raises(addr.NetlinkError, match="Network is unreachable"):
        list(addr.messages(_message(addr.NLMSG_ERROR, struct.pack("=i", -101) + b"\0" * 16)))
    # An acknowledgement (error 0) is no error and no message.
    assert list(addr.messages(_message(addr.NLMSG_ERROR, struct.pack("=i", 0) + b"\0" * 16))) == []
    whole = _message(addr.RTM_NEWROUTE, b"\0" * 12)
    with pytest.raises(addr.NetlinkError, match="netlink message of 28 bytes"):
        list(addr.messages(whole[:-4]))
    with pytest.raises(addr.NetlinkError, match="route attribute"):
        addr.attributes(struct.pack("=HH", 40, 1) + b"\0" * 4, 0)


def test_the_extended_flags_decide_secondary_and_a_peer_address_is_its_local_one():
    payload = _address(
        socket.AF_INET,
        3,
        30,
        local=(addr.IFA_LOCAL, _ip(socket.AF_INET, "10.6.0.1")),
        peer=(addr.IFA_ADDRESS, _ip(socket.AF_INET, "10.6.0.2")),
        label=(addr.IFA_LABEL, b"ppp0\0"),
        extended=(addr.IFA_FLAGS, struct.pack("=I", addr.IFA_F_SECONDARY | 0x100)),
    )
    record = addr.parse_address(payload)
    assert (record["address"], record["peer"], record["secondary"], record["label"]) == ("10.6.0.1", True, True, "ppp0")


def _record(family, index, address, secondary=False, **more):
    record = {"family": family, "index": index, "prefix": 64, "secondary": secondary, "scope": "global"}
    record.update(address=address, peer=False, label="", broadcast="", **more)
    return record


def test_setup_lists_each_interfaces_primary_addresses_then_its_temporary_ones_and_leaves_loopback_out():
    v6 = socket.AF_INET6
    records = [
        _record(v6, 2, "2001:db8::aaaa", secondary=True),
        _record(v6, 2, "2001:db8::1"),
        _record(v6, 1, "::1"),
        _record(socket.AF_INET, 1, "127.0.0.1", prefix=8),
        _record(v6, 2, "fe80::1", scope="link"),
    ]
    devices = [("eth0", 2, "02:00:00:00:00:02", 9000, "ether"), ("lo", 1, "00:00:00:00:00:00", 65536, "loopback")]
    routes = {v6: {"address": "2001:db8::aaaa", "interface": "eth0"}}
    facts = addr.assemble(routes, records, devices)
    assert facts["all_ipv6_addresses"] == ["2001:db8::1", "fe80::1", "2001:db8::aaaa"]
    assert facts["all_ipv4_addresses"] == []
    assert facts["default_ipv4"] == {}
    assert facts["default_ipv6"] == {
        "address": "2001:db8::aaaa",
        "interface": "eth0",
        "prefix": "64",
        "scope": "global",
        "macaddress": "02:00:00:00:00:02",
        "mtu": 9000,
        "type": "ether",
    }


def test_the_module_takes_setups_network_collector_where_rtnetlink_cannot_be_asked(monkeypatch):
    def refused():
        raise PermissionError("netlink refused")

    class Collected:
        def collect(self, module):
            return {"default_ipv4": {"address": "192.0.2.9"}, "all_ipv4_addresses": ["192.0.2.9"], "interfaces": ["x"]}

    asked = []
    monkeypatch.setattr(vllm_cpu_facts, "address_facts", refused)
    monkeypatch.setattr(
        "ansible.module_utils.facts.ansible_collector.get_ansible_collector",
        lambda **kwargs: asked.append(kwargs["gather_subset"]) or Collected(),
    )
    facts = vllm_cpu_facts.setup_facts(None, ["addresses"])
    assert asked == [["!all", "!min", "network"]]
    assert facts == {"default_ipv4": {"address": "192.0.2.9"}, "all_ipv4_addresses": ["192.0.2.9"]}
