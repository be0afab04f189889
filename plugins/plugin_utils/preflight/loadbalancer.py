"""Preflight's loadbalancer section: the load balancer's words that go into haproxy.cfg as written."""

import os
import re

from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.common import (
    HOST_NAME,
    _is_address,
    networks,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_syntax import (
    backend_address,
    haproxy_word,
    haproxy_words,
    say,
    url_path,
)
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_tls import LOADBALANCER_TLS, tls_problems

# HAProxy's time format (a whole number and an optional unit; without one, milliseconds).
HAPROXY_TIME = re.compile(r"^([0-9]+)(us|ms|s|m|h|d)?\Z")
# Where the hardened haproxy unit (loadbalancer_systemd_hardening) may write.
HAPROXY_RUNTIME_DIR = "/run/haproxy"
LB_TIMES = (
    "loadbalancer_check_interval",
    "loadbalancer_check_fast_interval",
    "loadbalancer_timeout_connect",
    "loadbalancer_timeout_client",
    "loadbalancer_timeout_server",
    "loadbalancer_timeout_queue",
)
# What HAProxy accepts in a proxy's name.
HAPROXY_NAME = re.compile(r"^[A-Za-z0-9_.:-]+\Z")
# An OpenSSL cipher list or TLS 1.3 suite list: one word.
CIPHER_LIST = re.compile(r"^[A-Za-z0-9_:+!@=.,-]+\Z")
# OpenSSL 3 at its default security level refuses TLS 1.0 and 1.1: HAProxy would start and every handshake fail.
TLS_VERSIONS = ("TLSv1.2", "TLSv1.3")


def loadbalancer(host, v, backends=None):
    """The load balancer's words that go into haproxy.cfg as written (one_line() keeps each on its line).
    `haproxy -c` would refuse most of them too, but only on the host, after the packages changed. backends: {backend
    host: its address, the value of the variable loadbalancer_backend_address_var names} where it renders now (the
    address of each `server` line)."""
    problems = []
    for name in LB_TIMES:
        value = v.get(name)
        time = HAPROXY_TIME.match(value) if isinstance(value, str) else None
        if isinstance(value, str) and not (time and int(time[1]) > 0):
            problems.append(
                f"{host}: {name}: is {value!r}, not a time HAProxy reads; fix: a whole number above 0 and a unit"
                " (us, ms, s, m, h, d), such as 2s or 10m."
            )
    name = v.get("loadbalancer_backend_name")
    if isinstance(name, str) and not HAPROXY_NAME.match(name):
        problems.append(
            f"{host}: loadbalancer_backend_name: {name!r} is no HAProxy proxy name; fix: letters, digits and"
            " - _ . : only, such as vllm."
        )
    # HAProxy sends the health path as the check's request line; the allow-lists are words of an ACL line, where
    # a `#` would start a comment and leave `path_beg /` (every route).
    path = v.get("loadbalancer_health_path")
    refusal = url_path(path) if path is not None else None
    if refusal:
        problems.append(say(host, "loadbalancer_health_path", path, refusal))
    for name, prefix in (("loadbalancer_allowed_path_prefixes", True), ("loadbalancer_allowed_paths", False)):
        for index, route in enumerate(v.get(name) or []):
            refusal = url_path(route, prefix=prefix)
            if refusal:
                problems.append(say(host, f"{name}[{index}]", route, refusal))
    target = v.get("loadbalancer_log_target")
    refusal = haproxy_words(target) if target is not None else None
    if refusal:
        problems.append(say(host, "loadbalancer_log_target", target, refusal))
    socket_path = v.get("loadbalancer_admin_socket")
    refusal = haproxy_word(socket_path) if socket_path is not None else None
    if refusal:
        problems.append(say(host, "loadbalancer_admin_socket", socket_path, refusal))
    if v.get("loadbalancer_systemd_hardening") and os.path.dirname(str(socket_path)) != HAPROXY_RUNTIME_DIR:
        problems.append(
            f"{host}: loadbalancer_admin_socket: {socket_path} is outside {HAPROXY_RUNTIME_DIR}, the only directory"
            f" the hardened unit (loadbalancer_systemd_hardening) may write; fix: keep it under {HAPROXY_RUNTIME_DIR}."
        )
    bind = v.get("loadbalancer_bind_address")
    if isinstance(bind, str) and bind not in ("*", "") and not (_is_address(bind) or HOST_NAME.match(bind)):
        problems.append(
            f"{host}: loadbalancer_bind_address: {bind!r} is no address HAProxy can listen on; fix: * (every"
            " address), one IPv4 or IPv6 address (without brackets) or a host name."
        )
    # HAProxy's `acl ... src` also reads a dotted IPv4 mask.
    problems += networks(host, "loadbalancer_metrics_allow", v, netmask=True)
    problems += backend_addresses(host, v.get("loadbalancer_backend_address_var", "ansible_host"), backends or {})
    version = v.get("loadbalancer_tls_min_version")
    if isinstance(version, str) and version not in TLS_VERSIONS:
        problems.append(f"{host}: loadbalancer_tls_min_version: is {version!r}; fix: {' or '.join(TLS_VERSIONS)}.")
    for name in ("loadbalancer_tls_ciphers", "loadbalancer_tls_ciphersuites"):
        value = v.get(name)
        if isinstance(value, str) and not CIPHER_LIST.match(value):
            problems.append(
                f"{host}: {name}: {value!r} is no OpenSSL cipher list; fix: names joined by colons, without blanks."
            )
    # What HAProxy loads as server.pem and its key: certificates, the key that belongs to them, dates, serverAuth, and
    # the chain when the CA is given (one without the other is the role's preflight's).
    certificate, key = v.get("loadbalancer_tls_certificate"), v.get("loadbalancer_tls_key")
    if isinstance(certificate, str) and certificate.strip() and isinstance(key, str) and key.strip():
        ca = v.get("loadbalancer_tls_ca_certificate")
        problems += tls_problems(
            host, certificate, key, ca if isinstance(ca, str) else "", [], variables=LOADBALANCER_TLS
        )
    return problems


def backend_addresses(host, variable, addresses):
    """Each backend host's address (addresses: {backend host: the value of variable}) as its `server` line and the
    admin socket's `set server ... addr` carry it: one IP address or DNS name (`10.0.0.5:8000 #` would comment out
    `ssl verify required`, `10.0.0.5 backup` or `weight 0` change what the server is). Said by the load balancer
    (host) and by the backend host itself."""
    problems = []
    for backend, address in addresses.items():
        refusal = backend_address(address)
        if refusal:
            problems.append(say(host, f"{variable} of {backend} (loadbalancer_backend_address_var)", address, refusal))
    return problems
