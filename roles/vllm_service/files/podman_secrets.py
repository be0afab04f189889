#!/usr/bin/env python3
"""Give podman the keys secrets.env holds, as the container units name them (roles/vllm_service, container mode).

    podman_secrets.py --env-file /etc/vllm/secrets.env --record /etc/vllm/podman-secrets.json [--podman podman]
                      [--force] VLLM_SERVICE_API_KEY=vllm-service-api-key ...

Each VARIABLE=secret: when secrets.env sets the variable (NAME="json string", as secrets.env.j2 writes it), the
podman secret holds its value; when it does not, the secret is removed. A secret is written again only when its
value changed since the last run (the record, root-only: an HMAC-SHA256 of each value under a random key of the
record's own, so that the record holds nothing a guess of a weak key could be checked against offline; a record
without one, an earlier format, has every secret written once) or podman lacks it, or with
--force (a rollback put back another secrets.env and record). ``podman secret rm`` then ``create`` (``--replace``
needs podman 4.7): a running container keeps the copy it got when it was created. The value goes in on standard
input, never on a command line. Prints {"changed", "written", "removed"} (secret names only).
"""

import argparse
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import sys


def read_env(path):
    values = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip() or line.lstrip().startswith("#") or "=" not in line:
                continue
            name, _sep, value = line.rstrip("\n").partition("=")
            values[name.strip()] = json.loads(value)
    return values


def podman(args, *words, data=None):
    done = subprocess.run([args.podman, *words], input=data, capture_output=True, timeout=120, check=False)
    return done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--podman", default="podman")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("secrets", nargs="+", help="VARIABLE=podman secret name")
    args = parser.parse_args()
    values = read_env(args.env_file)
    try:
        with open(args.record, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict) or not isinstance(record.get("salt"), str) or len(record["salt"]) != 64:
        record = {"salt": secrets.token_hex(32), "secrets": {}}
    salt = bytes.fromhex(record["salt"])
    recorded = record.get("secrets") if isinstance(record.get("secrets"), dict) else {}
    rc, out, err = podman(args, "secret", "ls", "--format", "{{.Name}}")
    if rc:
        sys.exit(f"podman secret ls: {err.strip()}")
    present = set(out.split())
    written, removed, digests = [], [], {}
    for pair in args.secrets:
        variable, _sep, name = pair.partition("=")
        value = values.get(variable)
        if not value:
            if name in present:
                rc, _out, err = podman(args, "secret", "rm", name)
                if rc:
                    sys.exit(f"podman secret rm {name}: {err.strip()}")
                removed.append(name)
            continue
        digest = hmac.new(salt, value.encode(), hashlib.sha256).hexdigest()
        digests[name] = digest
        if not args.force and name in present and hmac.compare_digest(str(recorded.get(name, "")), digest):
            continue
        if name in present:
            podman(args, "secret", "rm", name)
        rc, _out, err = podman(args, "secret", "create", name, "-", data=value.encode())
        if rc:
            sys.exit(f"podman secret create {name}: {err.strip()}")
        written.append(name)
    new_record = {"salt": record["salt"], "secrets": digests}
    if new_record != record or not os.path.exists(args.record):
        temporary = args.record + ".new"
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as handle:
            json.dump(new_record, handle, indent=1, sort_keys=True)
        os.replace(temporary, args.record)
    print(json.dumps({"changed": bool(written or removed), "written": written, "removed": removed}))


if __name__ == "__main__":
    main()
