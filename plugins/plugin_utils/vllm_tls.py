"""Preflight's check of a vLLM host's TLS inputs (the load balancer -> instance hop): the certificate, its key and
the fleet's CA, before any host changes.

What each destination needs: vLLM (uvicorn) loads the certificate chain and the key at start and dies on a mismatch;
HAProxy checks the chain against the CA (`verify required ca-file`) and, for a host with a name, that name among the
certificate's DNS names (`verifyhost`); Prometheus and the health probes check the chain, Prometheus also the address
it scrapes. A certificate that fails one of them would take the host out of service only after its restart.
"""

import datetime
import ipaddress
import itertools
import re

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID
except ImportError:  # pragma: no cover - ansible-core requires cryptography on the controller
    x509 = None

_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----\r?\n[A-Za-z0-9+/=\r\n]+-----END \1-----")
# Renewal before this is the operator's, not an outage's.
MIN_DAYS_LEFT = 7


def _blocks(text, kinds):
    """The PEM blocks of `text` whose type is in `kinds`, and whether anything else is in it."""
    text = str(text or "").strip()
    found = list(_PEM_BLOCK.finditer(text))
    rest = _PEM_BLOCK.sub("", text).strip()
    return [m.group(0) for m in found if m.group(1) in kinds], bool(rest) or any(m.group(1) not in kinds for m in found)


def is_ip(text):
    """Whether text is an IP address (a certificate names it as such, HAProxy's verifyhost cannot check it)."""
    try:
        ipaddress.ip_address(str(text))
    except ValueError:
        return False
    return True


def _covers(certificate, name):
    """Whether the certificate's subject alternative names cover `name` (an IP address or a DNS name; one leading
    wildcard label matches one label)."""
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    if is_ip(name):
        return ipaddress.ip_address(name) in names.get_values_for_type(x509.IPAddress)
    wanted = str(name).lower().rstrip(".")
    for dns in names.get_values_for_type(x509.DNSName):
        dns = dns.lower().rstrip(".")
        if dns == wanted or (dns.startswith("*.") and wanted.partition(".")[2] == dns[2:] and "." in wanted):
            return True
    return False


# The variables a host's TLS inputs come from, and who checks the certificate.
SERVICE_TLS = {
    "certificate": "vllm_service_tls_certificate",
    "key": "vllm_service_tls_key",
    "ca": "vllm_fleet_backend_tls_ca_certificate",
    "ca_role": "signed the vLLM hosts' certificates",
    "checked_by": "the load balancers",
    "reader": "vLLM",
    "fix": "fix: give the host's certificate (PEM, intermediates after it) from the fleet's CA",
}
LOADBALANCER_TLS = {
    "certificate": "loadbalancer_tls_certificate",
    "key": "loadbalancer_tls_key",
    "ca": "loadbalancer_tls_ca_certificate",
    "ca_role": "signed the load balancer's certificate",
    "checked_by": "clients that trust that CA",
    "reader": "HAProxy",
    "fix": "fix: give the load balancer's certificate (PEM, intermediates after it)",
}


def tls_problems(host, certificate_pem, key_pem, ca_pem, names, now=None, variables=None):
    """Every problem of a host's TLS inputs, worded `host: variable: problem; fix: ...` (an empty list: none).

    names: what the certificate must cover (the host's inventory name unless it is an address, the addresses the
    load balancers and monitoring hosts use for it). variables: SERVICE_TLS (the default: the CA is required) or
    LOADBALANCER_TLS (the CA is optional: only clients on the host read it; the chain is checked when it is given).
    """
    names_of = variables or SERVICE_TLS
    cert_name, key_name, ca_name = names_of["certificate"], names_of["key"], names_of["ca"]
    if x509 is None:  # pragma: no cover
        return [f"{host}: {cert_name}: the controller's Python lacks cryptography; fix: install it"]
    now = now or datetime.datetime.now(datetime.UTC)
    problems = []
    fix_cert = names_of["fix"]
    ca_required = variables is None or variables is SERVICE_TLS
    if ca_required and not str(ca_pem or "").strip():
        return [
            f"{host}: {ca_name}: is empty, and this host has a certificate"
            f" ({cert_name}), so nothing could check it; fix: set it to the CA certificate (PEM)"
            f" that {names_of['ca_role']}."
        ]
    if not str(key_pem or "").strip():
        problems.append(
            f"{host}: {key_name}: is empty, and {cert_name} is set; fix: give the"
            " certificate's private key (PEM, in Ansible Vault)."
        )
    chain, extra = _blocks(certificate_pem, {"CERTIFICATE"})
    has_ca = bool(str(ca_pem or "").strip())
    cas, ca_extra = _blocks(ca_pem, {"CERTIFICATE"}) if has_ca else ([], "")
    if not chain or extra:
        problems.append(
            f"{host}: {cert_name}: is not PEM certificates only (BEGIN/END CERTIFICATE blocks,"
            f" nothing between them); {fix_cert}."
        )
    if has_ca and (not cas or ca_extra):
        problems.append(
            f"{host}: {ca_name}: is not PEM certificates only; fix: give the CA"
            f" certificate (PEM) that {names_of['ca_role']}."
        )
    if problems:
        return problems
    try:
        leaf, *intermediates = [x509.load_pem_x509_certificate(block.encode()) for block in chain]
        authorities = [x509.load_pem_x509_certificate(block.encode()) for block in cas]
    except ValueError as err:
        return [
            f"{host}: {cert_name} or {ca_name}: unreadable ({err}); fix: give PEM certificates that"
            " `openssl x509 -noout -text` reads."
        ]
    if str(key_pem or "").strip():
        keys, key_extra = _blocks(key_pem, {"PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"})
        try:
            if len(keys) != 1 or key_extra:
                raise ValueError("not one unencrypted PEM private key")
            key = serialization.load_pem_private_key(keys[0].encode(), password=None)
            same = key.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            ) == leaf.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            if not same:
                problems.append(
                    f"{host}: {key_name}: is not the key of {cert_name} ({names_of['reader']} would not"
                    " start); fix: give the certificate's own key."
                )
        except (ValueError, TypeError) as err:
            problems.append(
                f"{host}: {key_name}: is not one unencrypted PEM private key ({err}); fix: give the"
                f" certificate's key, without a passphrase ({names_of['reader']} reads it at start), in Ansible Vault."
            )
    # The chain up to one of the CA's certificates: each certificate signed by the next, the last by the CA.
    issuer_chain = [leaf, *intermediates]
    try:
        for child, parent in itertools.pairwise(issuer_chain):
            child.verify_directly_issued_by(parent)
        top = issuer_chain[-1]
        if authorities and not any(_issued_by(top, ca) for ca in authorities):
            raise ValueError(f"no certificate of {ca_name} signed it")
    except (ValueError, TypeError, InvalidSignature) as err:
        problems.append(
            f"{host}: {cert_name}: is not signed by {ca_name} ({err}),"
            f" so {names_of['checked_by']} would refuse it; {fix_cert}, or set the CA that signed it."
        )
    not_before, not_after = _validity(leaf)
    if now < not_before:
        problems.append(
            f"{host}: {cert_name}: is valid only from {not_before:%Y-%m-%d %H:%M} UTC; fix: give one"
            " valid now (or check the controller's clock)."
        )
    elif now + datetime.timedelta(days=MIN_DAYS_LEFT) > not_after:
        problems.append(
            f"{host}: {cert_name}: expires {not_after:%Y-%m-%d %H:%M} UTC, in less than"
            f" {MIN_DAYS_LEFT} days; fix: renew it."
        )
    try:
        usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        if ExtendedKeyUsageOID.SERVER_AUTH not in usages:
            problems.append(
                f"{host}: {cert_name}: its extended key usage has no serverAuth, so clients refuse"
                f" it as a server's; {fix_cert} (extendedKeyUsage serverAuth)."
            )
    except x509.ExtensionNotFound:
        pass
    missing = [str(name) for name in names if name and not _covers(leaf, str(name))]
    if missing:
        problems.append(
            f"{host}: {cert_name}: its subject alternative names do not cover {', '.join(missing)}"
            " (the load balancers check the host's name, the monitoring hosts the address they scrape); fix: give a"
            " certificate naming " + ", ".join(("IP:" if is_ip(name) else "DNS:") + name for name in missing) + "."
        )
    return problems


def _issued_by(certificate, authority):
    try:
        certificate.verify_directly_issued_by(authority)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _validity(certificate):
    """(not before, not after) as aware UTC datetimes, on cryptography releases before and after 42."""
    if hasattr(certificate, "not_valid_after_utc"):
        return certificate.not_valid_before_utc, certificate.not_valid_after_utc
    utc = datetime.UTC
    return certificate.not_valid_before.replace(tzinfo=utc), certificate.not_valid_after.replace(tzinfo=utc)
