"""roles/monitoring/files/vllm_certificates.py: the validity of the certificates a fleet host holds, read from their
DER with the standard library, checked against what the `cryptography` library wrote into them (UTCTime before
2050, GeneralizedTime from 2050, chains, common names of every string type) and against garbled input."""

import datetime
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

SCRIPT = Path(__file__).resolve().parents[2] / "roles/monitoring/files/vllm_certificates.py"
_SPEC = importlib.util.spec_from_file_location("vllm_certificates", SCRIPT)
certs = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(certs)
KEY = ec.generate_private_key(ec.SECP256R1())
UTC = datetime.UTC


def make(not_before, not_after, name="vllm-1.example", extra_subject=()):
    subject = x509.Name([*extra_subject, x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(KEY.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    return builder.sign(KEY, hashes.SHA256())


def pem(*certificates):
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def stamp(when):
    return int(when.timestamp())


def test_a_chain_gives_every_certificates_dates_and_name(tmp_path):
    leaf = make(datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), datetime.datetime(2027, 1, 2, 3, 4, 5, tzinfo=UTC))
    ca = make(
        datetime.datetime(2020, 6, 1, tzinfo=UTC),
        datetime.datetime(2060, 6, 1, tzinfo=UTC),  # GeneralizedTime from 2050 (RFC 5280)
        name="Fleet CA",
        extra_subject=[x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example")],
    )
    path = tmp_path / "chain.pem"
    path.write_bytes(b"subject=...\n" + pem(leaf, ca))
    found = certs.read_file(str(path))
    assert found["ok"] and found["error"] == ""
    assert found["certificates"] == [
        {"not_before": stamp(leaf.not_valid_before_utc), "not_after": stamp(leaf.not_valid_after_utc),
         "subject": "vllm-1.example"},
        {"not_before": stamp(ca.not_valid_before_utc), "not_after": stamp(ca.not_valid_after_utc),
         "subject": "Fleet CA"},
    ]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    start=st.datetimes(min_value=datetime.datetime(1951, 1, 1), max_value=datetime.datetime(2200, 1, 1)),
    days=st.integers(min_value=0, max_value=40000),
    # A common name is at most 64 bytes of UTF-8 (cryptography refuses more): 16 characters of at most 4 bytes.
    name=st.text(min_size=1, max_size=16).filter(lambda text: "\x00" not in text),
)
def test_the_dates_are_the_ones_the_certificate_holds(tmp_path_factory, start, days, name):
    not_before = start.replace(microsecond=0, tzinfo=UTC)
    not_after = not_before + datetime.timedelta(days=days, seconds=7)
    cert = make(not_before, not_after, name=name)
    der = cert.public_bytes(serialization.Encoding.DER)
    found = certs.certificate(der)
    assert found == {"not_before": stamp(not_before), "not_after": stamp(not_after), "subject": name}


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"", "no PEM certificate"),
        (b"-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n", "no PEM certificate"),
        (b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n", "certificate 0"),
        (b"-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n", "certificate 0: truncated"),
    ],
)
def test_a_file_without_a_readable_certificate_says_so(tmp_path, content, error):
    path = tmp_path / "tls.crt"
    path.write_bytes(content)
    found = certs.read_file(str(path))
    assert not found["ok"] and found["error"].startswith(error), found


def test_a_certificate_cut_short_is_refused_wherever_it_is_cut():
    der = make(datetime.datetime(2026, 1, 1, tzinfo=UTC), datetime.datetime(2027, 1, 1, tzinfo=UTC)).public_bytes(
        serialization.Encoding.DER
    )
    for end in range(len(der)):
        with pytest.raises(certs.NotACertificate):
            certs.certificate(der[:end])
    with pytest.raises(certs.NotACertificate):
        certs.certificate(der + b"\x00")


def test_an_absent_file_is_left_out_and_the_rest_is_exported(tmp_path):
    good = tmp_path / "tls.crt"
    good.write_bytes(pem(make(datetime.datetime(2026, 1, 1, tzinfo=UTC), datetime.datetime(2027, 1, 1, tzinfo=UTC))))
    bad = tmp_path / "ca.crt"
    bad.write_bytes(b"garbage")
    out = tmp_path / "certificates.prom"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--file", f"instance={good}", "--file", f"ca={bad}",
         "--file", f"loadbalancer={tmp_path / 'absent.pem'}", "--output", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert f'vllm_fleet_certificate_file_ok{{file="{good}",kind="instance"}} 1' in text
    assert f'vllm_fleet_certificate_file_ok{{file="{bad}",kind="ca"}} 0' in text
    assert "absent.pem" not in text
    expires = stamp(datetime.datetime(2027, 1, 1, tzinfo=UTC))
    assert (
        f'vllm_fleet_certificate_not_after_seconds{{file="{good}",index="0",kind="instance",subject="vllm-1.example"}}'
        f" {expires}" in text
    )
    assert "vllm_fleet_certificates_timestamp_seconds " in text
    assert not (tmp_path / "certificates.prom.tmp").exists()


def test_a_subject_with_quotes_and_newlines_stays_one_label():
    text = certs.exposition(
        {("ca", "/etc/x.crt"): {"ok": True, "error": "", "certificates": [
            {"not_before": 1, "not_after": 2, "subject": 'a"b\\c\nd'}]}},
        10,
    )  # fmt: skip
    assert 'subject="a\\"b\\\\c\\nd"' in text
    assert len([line for line in text.splitlines() if line.startswith("vllm_fleet_certificate_not_after")]) == 1


@pytest.mark.parametrize("argument", ["instance", "web=/etc/x.crt", "ca=relative.crt"])
def test_a_file_argument_is_kind_and_absolute_path(argument):
    argv = [sys.executable, str(SCRIPT), "--file", argument]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "KIND=/absolute/path" in done.stderr
