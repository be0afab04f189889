"""The four address facts of setup's network subset, read over rtnetlink in this process.

setup's network collector starts ``ip`` twice for the default routes, twice per interface for its
addresses, twice more for the local routes, and ``ethtool`` twice per interface where it is
installed: on a host with a bridge and a few dozen container interfaces that is most of a facts
run. The roles and inventories read four of its facts (``default_ipv4``, ``default_ipv6``,
``all_ipv4_addresses``, ``all_ipv6_addresses``); ``address_facts`` returns those four with setup's
values, from one route request per family and one address dump, following the rules of
ansible/module_utils/facts/network/linux.py (restated below where they matter).
"""

import os
import socket
import struct

NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWADDR, RTM_GETADDR, RTM_NEWROUTE, RTM_GETROUTE = 20, 22, 24, 26
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFA_ADDRESS, IFA_LOCAL, IFA_LABEL, IFA_BROADCAST, IFA_FLAGS = 1, 2, 3, 4, 8
# IFA_F_TEMPORARY for IPv6 is the same bit: `ip addr show secondary` lists both.
IFA_F_SECONDARY = 0x01
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PREFSRC = 1, 4, 5, 7
RTN_UNICAST = 1
# The destinations setup asks the routing table about (`ip -4 route get 8.8.8.8`, `ip -6 route get ...`).
PROBES = {socket.AF_INET: "8.8.8.8", socket.AF_INET6: "2404:6800:400a:800::1012"}
# iproute2's names for address scopes (/etc/iproute2/rt_scopes); others print as numbers.
SCOPES = {0: "global", 200: "site", 253: "link", 254: "host", 255: "nowhere"}
# setup's names for /sys/class/net/<dev>/type.
INTERFACE_TYPES = {"1": "ether", "32": "infiniband", "512": "ppp", "772": "loopback", "65534": "tunnel"}

ADDRESS_FACTS = ("default_ipv4", "default_ipv6", "all_ipv4_addresses", "all_ipv6_addresses")

_HEADER = struct.Struct("=LHHLL")
_ATTRIBUTE = struct.Struct("=HH")
_IFADDRMSG = struct.Struct("=BBBBL")
_RTMSG = struct.Struct("=BBBBBBBBL")
_RECEIVE_BYTES = 1 << 16


class NetlinkError(Exception):
    """A netlink answer that cannot be read, or an error the kernel answered with."""


def _aligned(length):
    return (length + 3) & ~3


def messages(data):
    """(type, payload) of each netlink message in one datagram; NetlinkError for an error message."""
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind = _HEADER.unpack_from(data, offset)[:2]
        if length < _HEADER.size or offset + length > len(data):
            raise NetlinkError(f"a netlink message of {length} bytes at offset {offset} of {len(data)}")
        payload = data[offset + _HEADER.size : offset + length]
        if kind == NLMSG_ERROR:
            errno = -struct.unpack_from("=i", payload)[0] if len(payload) >= 4 else 0
            if errno:
                raise NetlinkError(os.strerror(errno))
        else:
            yield kind, payload
        offset += _aligned(length)


def attributes(payload, offset):
    """{type: bytes} of the route attributes from offset on (a later duplicate wins, as in iproute2)."""
    found = {}
    while offset + _ATTRIBUTE.size <= len(payload):
        length, kind = _ATTRIBUTE.unpack_from(payload, offset)
        if length < _ATTRIBUTE.size or offset + length > len(payload):
            raise NetlinkError(f"a route attribute of {length} bytes at offset {offset} of {len(payload)}")
        found[kind & 0x3FFF] = payload[offset + _ATTRIBUTE.size : offset + length]
        offset += _aligned(length)
    return found


def _text(family, raw):
    return socket.inet_ntop(family, raw)


def parse_route(family, payload, index_name=socket.if_indextoname):
    """What `ip route get <probe>` prints as dev, src and via, as setup reads them ({} unless a unicast route)."""
    fields = _RTMSG.unpack_from(payload)
    if fields[7] != RTN_UNICAST:
        # ip prints the type first ("unreachable 8.8.8.8 ..."): setup takes no fact from such a line.
        return {}
    found = attributes(payload, _RTMSG.size)
    route = {}
    if RTA_GATEWAY in found and _text(family, found[RTA_GATEWAY]) != PROBES[family]:
        route["gateway"] = _text(family, found[RTA_GATEWAY])
    if RTA_OIF in found:
        index = struct.unpack("=I", found[RTA_OIF][:4])[0]
        try:
            route["interface"] = index_name(index)
        except OSError:
            route["interface"] = f"if{index}"
    if RTA_PREFSRC in found:
        route["address"] = _text(family, found[RTA_PREFSRC])
    return route


def parse_address(payload):
    """One address of the dump: family, index, prefix, flags, scope, local, peer, label, broadcast."""
    family, prefix, flags, scope, index = _IFADDRMSG.unpack_from(payload)
    found = attributes(payload, _IFADDRMSG.size)
    if IFA_FLAGS in found:
        flags = struct.unpack("=I", found[IFA_FLAGS][:4])[0]
    address = found.get(IFA_ADDRESS)
    local = found.get(IFA_LOCAL, address)
    if local is None:
        return None
    return {
        "family": family,
        "index": index,
        "prefix": prefix,
        "secondary": bool(flags & IFA_F_SECONDARY),
        "scope": SCOPES.get(scope, str(scope)),
        "address": _text(family, local),
        # ip prints "<local> peer <address>/<prefix>" when they differ, and setup then reads no prefix.
        "peer": address is not None and address != local,
        "label": found[IFA_LABEL].split(b"\0", 1)[0].decode("utf-8", "surrogateescape") if IFA_LABEL in found else "",
        "broadcast": _text(family, found[IFA_BROADCAST]) if IFA_BROADCAST in found else "",
    }


def ask(kind, flags, body, protocol=socket.NETLINK_ROUTE):
    """The messages the kernel answers a request with, up to the dump's end (or the one answer)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol) as sock:
        sock.settimeout(10)
        sock.bind((0, 0))
        sock.send(_HEADER.pack(_HEADER.size + len(body), kind, NLM_F_REQUEST | flags, 1, 0) + body)
        answers = []
        while True:
            data, _unused, received_flags, _unused = sock.recvmsg(_RECEIVE_BYTES)
            if received_flags & socket.MSG_TRUNC:
                raise NetlinkError(f"a netlink answer longer than {_RECEIVE_BYTES} bytes")
            for answer in messages(data):
                if answer[0] == NLMSG_DONE:
                    return answers
                answers.append(answer)
            if not flags & NLM_F_DUMP and answers:
                return answers


def default_route(family):
    """setup's default_ipv4 or default_ipv6 before it adds the interface's details: {} without a route."""
    raw = socket.inet_pton(family, PROBES[family])
    destination = _ATTRIBUTE.pack(_ATTRIBUTE.size + len(raw), RTA_DST) + raw
    body = _RTMSG.pack(family, len(raw) * 8, 0, 0, 0, 0, 0, 0, 0) + destination
    try:
        answers = ask(RTM_GETROUTE, 0, body)
    except NetlinkError:
        # "Network is unreachable": ip prints nothing on stdout, setup keeps {}.
        return {}
    for kind, payload in answers:
        if kind == RTM_NEWROUTE:
            return parse_route(family, payload)
    return {}


def addresses():
    """Every address of every interface, in the kernel's order."""
    answers = ask(RTM_GETADDR, NLM_F_DUMP, _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0))
    found = (parse_address(payload) for kind, payload in answers if kind == RTM_NEWADDR)
    return [address for address in found if address and address["family"] in (socket.AF_INET, socket.AF_INET6)]


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def interfaces(sys_class_net="/sys/class/net"):
    """[(name, index, macaddress, mtu, type)] in setup's order (the directory's), as setup reads them."""
    found = []
    for name in os.listdir(sys_class_net):
        path = os.path.join(sys_class_net, name)
        if not os.path.isdir(path):
            continue
        index = _read(os.path.join(path, "ifindex"))
        kind = INTERFACE_TYPES.get(_read(os.path.join(path, "type")), "unknown")
        if os.path.exists(os.path.join(path, "bridge")):
            kind = "bridge"
        if os.path.exists(os.path.join(path, "bonding")):
            kind = "bonding"
        mtu = _read(os.path.join(path, "mtu"))
        found.append(
            (
                name,
                int(index) if index.isdigit() else -1,
                _read(os.path.join(path, "address")),
                int(mtu) if mtu.isdigit() else None,
                kind,
            )
        )
    return found


def assemble(routes, records, devices):
    """setup's four facts from the default routes, the address dump and the interfaces (see the module's doc).

    setup walks the interfaces in /sys/class/net's order, each one's primary addresses and then its
    secondary (IPv6: temporary) ones, leaves 127.0.0.0/8 and ::1 out of the lists, and gives a default
    route the details of every address equal to its source address (the last one wins).
    """
    default = {family: dict(routes.get(family) or {}) for family in PROBES}
    lists = {socket.AF_INET: [], socket.AF_INET6: []}
    for name, index, macaddress, mtu, kind in devices:
        mine = [record for record in records if record["index"] == index]
        for record in [r for r in mine if not r["secondary"]] + [r for r in mine if r["secondary"]]:
            family, address = record["family"], record["address"]
            route = default[family]
            if family == socket.AF_INET:
                prefix = "32" if record["peer"] else str(record["prefix"])
                if route.get("address") == address:
                    netmask = (1 << 32) - (1 << 32 >> int(prefix))
                    network = struct.unpack("!L", socket.inet_aton(address))[0] & netmask
                    route.update(
                        broadcast="" if record["peer"] else record["broadcast"],
                        netmask=socket.inet_ntoa(struct.pack("!L", netmask)),
                        network=socket.inet_ntoa(struct.pack("!L", network)),
                        prefix=prefix,
                        macaddress=macaddress,
                        mtu=mtu,
                        type=kind,
                        alias=record["label"] or name,
                    )
                if not address.startswith("127."):
                    lists[family].append(address)
            else:
                if route.get("address") == address:
                    route.update(
                        prefix=str(record["prefix"]), scope=record["scope"], macaddress=macaddress, mtu=mtu, type=kind
                    )
                if address != "::1":
                    lists[family].append(address)
    return {
        "default_ipv4": default[socket.AF_INET],
        "default_ipv6": default[socket.AF_INET6],
        "all_ipv4_addresses": lists[socket.AF_INET],
        "all_ipv6_addresses": lists[socket.AF_INET6],
    }


def address_facts(sys_class_net="/sys/class/net"):
    """The four facts of this host; NetlinkError or OSError when rtnetlink cannot be asked."""
    families = [socket.AF_INET] + ([socket.AF_INET6] if socket.has_ipv6 else [])
    routes = {family: default_route(family) for family in families}
    return assemble(routes, addresses(), interfaces(sys_class_net))
