"""The validity of the TLS certificates a fleet host holds, for the node exporter's textfile collector
(--output, written atomically by vllm-fleet-certificates.timer; issue 42, item 2).

Each --file KIND=PATH is a PEM file the roles wrote: an instance's certificate, a load balancer's, a CA the host
trusts. Every certificate in it (a chain has several) gets its notAfter, notBefore and subject's common name,
read from its DER (the standard library parses no X.509, and a host may have no openssl). A file that is absent
is left out (TLS is off there); one that holds no certificate it can read says so (file_ok 0), so that a garbled
file alerts instead of vanishing.

Standard library only; reads only the files named.
"""

import argparse
import base64
import binascii
import calendar
import os
import re
import sys
import time

PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n(.*?)-----END CERTIFICATE-----", re.S)
COMMON_NAME = bytes.fromhex("550403")  # 2.5.4.3
KINDS = ("instance", "loadbalancer", "ca")


class NotACertificate(ValueError):
    pass


def _tlv(der, pos, want=None):
    """(tag, content start, content end) of the DER element at pos."""
    if pos + 2 > len(der):
        raise NotACertificate("truncated")
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4 or pos + count > len(der):
            raise NotACertificate("bad length")
        length = int.from_bytes(der[pos : pos + count], "big")
        pos += count
    if pos + length > len(der):
        raise NotACertificate("truncated")
    if want is not None and tag != want:
        raise NotACertificate(f"tag {tag:#x} where {want:#x} belongs")
    return tag, pos, pos + length


def _time(tag, raw):
    """Seconds since the epoch of an X.509 UTCTime (tag 0x17) or GeneralizedTime (0x18), in UTC."""
    text = raw.decode("ascii", "replace")
    if tag == 0x17 and re.fullmatch(r"\d{12}Z", text):
        year = int(text[:2])
        year += 2000 if year < 50 else 1900  # RFC 5280 4.1.2.5.1
        rest = text[2:]
    elif tag == 0x18 and re.fullmatch(r"\d{14}Z", text):
        year, rest = int(text[:4]), text[4:]
    else:
        raise NotACertificate(f"not a UTC time: {text!r}")
    month, day, hour, minute, second = (int(rest[i : i + 2]) for i in range(0, 10, 2))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        raise NotACertificate(f"not a date: {text!r}")
    return calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))


def _common_name(der, start, end):
    """The subject's first common name, or ""."""
    pos = start
    while pos < end:
        _tag, set_start, set_end = _tlv(der, pos, 0x31)
        inner = set_start
        while inner < set_end:
            _tag, attr_start, attr_end = _tlv(der, inner, 0x30)
            _tag, oid_start, oid_end = _tlv(der, attr_start, 0x06)
            if der[oid_start:oid_end] == COMMON_NAME:
                _tag, value_start, value_end = _tlv(der, oid_end)
                return der[value_start:value_end].decode("utf-8", "replace")
            inner = attr_end
        pos = set_end
    return ""


def certificate(der):
    """{not_before, not_after, subject} of one DER certificate; NotACertificate for anything else."""
    _tag, cert_start, cert_end = _tlv(der, 0, 0x30)
    if cert_end != len(der):
        raise NotACertificate("trailing bytes")
    _tag, pos, _tbs_end = _tlv(der, cert_start, 0x30)
    tag, _start, end = _tlv(der, pos)
    if tag == 0xA0:  # [0] version
        tag, _start, end = _tlv(der, end)
    if tag != 0x02:  # serialNumber
        raise NotACertificate("no serial number")
    _tag, _start, end = _tlv(der, end, 0x30)  # signature algorithm
    _tag, _start, end = _tlv(der, end, 0x30)  # issuer
    _tag, validity, validity_end = _tlv(der, end, 0x30)
    before_tag, before_start, before_end = _tlv(der, validity)
    after_tag, after_start, after_end = _tlv(der, before_end)
    if after_end != validity_end:
        raise NotACertificate("validity is not two times")
    _tag, subject_start, subject_end = _tlv(der, validity_end, 0x30)
    return {
        "not_before": _time(before_tag, der[before_start:before_end]),
        "not_after": _time(after_tag, der[after_start:after_end]),
        "subject": _common_name(der, subject_start, subject_end),
    }


def read_file(path):
    """{"ok": bool, "certificates": [...], "error": str} of a PEM file; None when it is absent."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(4 * 1024 * 1024)
    except FileNotFoundError:
        return None
    except OSError as err:
        return {"ok": False, "certificates": [], "error": type(err).__name__}
    found = []
    for block in PEM.findall(data):
        try:
            found.append(certificate(base64.b64decode(b"".join(block.split()), validate=True)))
        except (NotACertificate, binascii.Error, ValueError) as err:
            return {"ok": False, "certificates": found, "error": f"certificate {len(found)}: {err}"}
    if not found:
        return {"ok": False, "certificates": [], "error": "no PEM certificate"}
    return {"ok": True, "certificates": found, "error": ""}


def _label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(files, now):
    """The textfile collector's text for {(kind, path): read_file result}."""
    lines = []

    def family(name, help_text, samples):
        if not samples:
            return
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} gauge"])
        for labels, value in samples:
            text = ",".join(f'{key}="{_label(labels[key])}"' for key in sorted(labels))
            lines.append(f"{name}{{{text}}} {value}")

    read = [(kind, path, found) for (kind, path), found in sorted(files.items()) if found is not None]
    family(
        "vllm_fleet_certificate_file_ok",
        "1 when every certificate of the file could be read (0: garbled, unreadable, or none in it).",
        [({"kind": kind, "file": path}, int(found["ok"])) for kind, path, found in read],
    )
    for metric, key, help_text in (
        ("vllm_fleet_certificate_not_after_seconds", "not_after", "When the certificate expires (its notAfter)."),
        ("vllm_fleet_certificate_not_before_seconds", "not_before", "When the certificate starts being valid."),
    ):
        family(
            metric,
            help_text,
            [
                ({"kind": kind, "file": path, "index": str(index), "subject": cert["subject"]}, cert[key])
                for kind, path, found in read
                for index, cert in enumerate(found["certificates"])
            ],
        )
    family("vllm_fleet_certificates_timestamp_seconds", "When the certificates were read.", [({}, int(now))])
    return "\n".join(lines) + "\n"


def _kind_path(text):
    kind, sep, path = text.partition("=")
    if not sep or kind not in KINDS or not path.startswith("/"):
        raise argparse.ArgumentTypeError(f"{text!r}: write KIND=/absolute/path, KIND one of {', '.join(KINDS)}")
    return kind, path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=_kind_path, action="append", default=[], metavar="KIND=PATH")
    parser.add_argument("--output", help="write here atomically instead of stdout")
    args = parser.parse_args(argv)
    text = exposition({(kind, path): read_file(path) for kind, path in args.file}, time.time())
    if not args.output:
        sys.stdout.write(text)
        return 0
    temporary = f"{args.output}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
