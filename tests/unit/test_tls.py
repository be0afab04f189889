"""Preflight's check of a vLLM host's TLS inputs (plugin_utils/vllm_tls.py), on certificates made here."""

import datetime
import ipaddress

import pytest
from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.vllm_tls import tls_problems
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = datetime.datetime(2026, 11, 27, tzinfo=datetime.UTC)


def pem(certificate):
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def key_pem(key):
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def make(subject, issuer_key, public_key, issuer=None, ca=False, names=(), days=(-1, 365), usage=None):
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW + datetime.timedelta(days=days[0]))
        .not_valid_after(NOW + datetime.timedelta(days=days[1]))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if names:
        alternative = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in names]
        builder = builder.add_extension(x509.SubjectAlternativeName(alternative), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki():
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = make("fleet CA", ca_key, ca_key.public_key(), ca=True)
    host_key = ec.generate_private_key(ec.SECP256R1())
    leaf = make("web-1", ca_key, host_key.public_key(), issuer=ca, names=("web-1", "10.0.0.5"))
    return {"ca_key": ca_key, "ca": ca, "key": host_key, "leaf": leaf}


def check(pki, certificate=None, key=None, ca=None, names=("web-1", "10.0.0.5")):
    return tls_problems(
        "web-1",
        pem(certificate or pki["leaf"]) if not isinstance(certificate, str) else certificate,
        key_pem(key or pki["key"]) if not isinstance(key, str) else key,
        pem(ca or pki["ca"]) if not isinstance(ca, str) else ca,
        list(names),
        now=NOW,
    )


def test_a_good_certificate_passes(pki):
    assert check(pki) == []


def test_a_name_or_address_the_certificate_does_not_cover_is_named(pki):
    problems = check(pki, names=("web-1", "10.0.0.6", "web-1.example"))
    assert len(problems) == 1
    assert "do not cover 10.0.0.6, web-1.example" in problems[0]
    assert "IP:10.0.0.6, DNS:web-1.example" in problems[0]
    assert problems[0].startswith("web-1: vllm_service_tls_certificate:") and "fix:" in problems[0]


def test_a_wildcard_covers_one_label_only(pki):
    leaf = make("w", pki["ca_key"], pki["key"].public_key(), issuer=pki["ca"], names=("*.fleet.example",))
    assert check(pki, certificate=leaf, names=("a.fleet.example",)) == []
    assert check(pki, certificate=leaf, names=("a.b.fleet.example",))
    assert check(pki, certificate=leaf, names=("fleet.example",))


def test_another_key_is_refused(pki):
    other = ec.generate_private_key(ec.SECP256R1())
    problems = check(pki, key=other)
    assert len(problems) == 1 and "vllm_service_tls_key: is not the key of" in problems[0]


def test_a_certificate_another_ca_signed_is_refused(pki):
    rogue_key = ec.generate_private_key(ec.SECP256R1())
    rogue = make("rogue CA", rogue_key, rogue_key.public_key(), ca=True)
    leaf = make("web-1", rogue_key, pki["key"].public_key(), issuer=rogue, names=("web-1", "10.0.0.5"))
    problems = check(pki, certificate=leaf)
    assert len(problems) == 1 and "is not signed by vllm_fleet_backend_tls_ca_certificate" in problems[0]


def test_an_intermediate_chain_up_to_the_ca_passes(pki):
    mid_key = ec.generate_private_key(ec.SECP256R1())
    mid = make("intermediate", pki["ca_key"], mid_key.public_key(), issuer=pki["ca"], ca=True)
    leaf = make("web-1", mid_key, pki["key"].public_key(), issuer=mid, names=("web-1", "10.0.0.5"))
    assert check(pki, certificate=pem(leaf) + pem(mid)) == []
    # Without the intermediate, the chain does not reach the CA.
    assert check(pki, certificate=leaf)


@pytest.mark.parametrize(
    ("days", "said"), [((-30, 3), "in less than 7 days"), ((-30, -1), "in less than 7 days"), ((2, 30), "valid only")]
)
def test_an_expired_expiring_or_future_certificate_is_refused(pki, days, said):
    leaf = make("web-1", pki["ca_key"], pki["key"].public_key(), issuer=pki["ca"], names=("web-1",), days=days)
    problems = check(pki, certificate=leaf, names=("web-1",))
    assert len(problems) == 1 and said in problems[0], problems


def test_a_certificate_for_clients_only_is_refused(pki):
    usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
    leaf = make("web-1", pki["ca_key"], pki["key"].public_key(), issuer=pki["ca"], names=("web-1",), usage=usage)
    problems = check(pki, certificate=leaf, names=("web-1",))
    assert len(problems) == 1 and "no serverAuth" in problems[0]


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("certificate", "not a certificate", "vllm_service_tls_certificate: is not PEM certificates only"),
        ("certificate", "{cert}\n# a comment", "vllm_service_tls_certificate: is not PEM certificates only"),
        ("ca", "", "vllm_fleet_backend_tls_ca_certificate: is empty"),
        ("ca", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----", "unreadable"),
        ("key", "", "vllm_service_tls_key: is empty"),
        ("key", "{cert}", "vllm_service_tls_key: is not one unencrypted PEM private key"),
    ],
)
def test_bad_pem_inputs_are_named(pki, field, value, said):
    value = value.replace("{cert}", pem(pki["leaf"]))
    problems = check(pki, **{field: value})
    assert problems and any(said in p for p in problems), problems
    assert all(p.startswith("web-1: ") for p in problems)


def test_an_encrypted_key_is_refused(pki):
    encrypted = (
        pki["key"]
        .private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")
        )
        .decode()
    )
    problems = check(pki, key=encrypted)
    assert len(problems) == 1 and "without a passphrase" in problems[0]


# ---------------------------------------------------------------------------------- the load balancer's (issue 44)


def lb(pki, certificate=None, key=None, ca=""):
    from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.loadbalancer import loadbalancer

    v = {
        "loadbalancer_tls_certificate": (
            certificate if isinstance(certificate, str) else pem(certificate or pki["leaf"])
        ),
        "loadbalancer_tls_key": key if isinstance(key, str) else key_pem(key or pki["key"]),
        "loadbalancer_tls_ca_certificate": ca if isinstance(ca, str) else pem(ca),
    }
    return loadbalancer("lb-1", v)


def test_the_load_balancers_good_certificate_passes_with_and_without_its_ca(pki):
    assert lb(pki) == []
    assert lb(pki, ca=pki["ca"]) == []


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            {"certificate": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"},
            "lb-1: loadbalancer_tls_certificate or loadbalancer_tls_ca_certificate: unreadable",
        ),
        ({"certificate": "{cert}\ntrailing words"}, "lb-1: loadbalancer_tls_certificate: is not PEM certificates only"),
        ({"key": "other"}, "lb-1: loadbalancer_tls_key: is not the key of loadbalancer_tls_certificate (HAProxy"),
        ({"key": "{cert}"}, "lb-1: loadbalancer_tls_key: is not one unencrypted PEM private key"),
        ({"certificate": "expired"}, "lb-1: loadbalancer_tls_certificate: expires"),
        ({"certificate": "client"}, "lb-1: loadbalancer_tls_certificate: its extended key usage has no serverAuth"),
        ({"ca": "rogue"}, "lb-1: loadbalancer_tls_certificate: is not signed by loadbalancer_tls_ca_certificate"),
    ],
)
def test_a_load_balancer_certificate_that_is_not_what_it_claims_is_refused(pki, change, said):
    """The role's own check only searched for a BEGIN line: each of these reached HAProxy."""
    kwargs = {}
    for field, value in change.items():
        if value == "other":
            value = ec.generate_private_key(ec.SECP256R1())
        elif value == "expired":
            value = make("lb-1", pki["ca_key"], pki["key"].public_key(), issuer=pki["ca"], days=(-30, -1))
        elif value == "client":
            usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
            value = make("lb-1", pki["ca_key"], pki["key"].public_key(), issuer=pki["ca"], usage=usage)
        elif value == "rogue":
            rogue_key = ec.generate_private_key(ec.SECP256R1())
            value = make("rogue CA", rogue_key, rogue_key.public_key(), ca=True)
        elif isinstance(value, str):
            value = value.replace("{cert}", pem(pki["leaf"]))
        kwargs[field] = value
    problems = lb(pki, **kwargs)
    assert problems and any(p.startswith(said) for p in problems), problems
    assert all("; fix: " in p for p in problems)


def test_no_certificate_is_the_roles_own_check(pki):
    from ansible_collections.vllm.cpu_fleet.plugins.plugin_utils.preflight.loadbalancer import loadbalancer

    assert loadbalancer("lb-1", {"loadbalancer_tls_certificate": "", "loadbalancer_tls_key": ""}) == []
