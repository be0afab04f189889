#!/usr/bin/env python3
"""Reads each local vLLM instance's /metrics twice, SECONDS apart, for the fleet report (playbooks/report.yml,
when the inventory has no monitoring host). Runs on the vLLM host: /metrics answers without the API key there.

    fleet_report_sample.py --seconds 5 --address 127.0.0.1 --address 10.0.0.7 vllm-0=8000 vllm-1=8001

Tries the addresses in order per instance (an instance listens on the address the load balancers use, which
this host reaches over loopback too), over HTTPS then plain HTTP where --ca-file names the fleet's CA (a host with a
certificate serves HTTPS; the certificate is checked against the CA, not its name: this host reads itself).
Prints JSON: {"seconds": measured interval, "instances": {name: {"url",
"first", "second", "error"}}}, keeping only the vllm: lines. Standard library only; changes nothing.
"""

import argparse
import json
import os
import ssl
import sys
import time
import urllib.request

# This host's own instances: never through a proxy the environment may name.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def https_opener(ca_file):
    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = False
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))


def read(url, timeout, opener=OPENER):
    with opener.open(url, timeout=timeout) as answer:
        text = answer.read().decode("utf-8", "replace")
    return "\n".join(line for line in text.splitlines() if "vllm:" in line)


def first_read(port, addresses, timeout, opener=OPENER):
    errors = []
    for scheme in ("https", "http") if opener is not OPENER else ("http",):
        for address in addresses:
            host = f"[{address}]" if ":" in address else address
            url = f"{scheme}://{host}:{port}/metrics"
            try:
                return url, read(url, timeout, opener), ""
            except (OSError, ValueError) as err:
                errors.append(f"{url}: {getattr(err, 'reason', err)}")
    return "", None, "; ".join(errors) or "no address to try"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--address", action="append", default=[])
    parser.add_argument("--ca-file", default="", help="the fleet's CA, when this host may serve HTTPS")
    parser.add_argument("instances", nargs="*", help="name=port")
    args = parser.parse_args(argv)
    opener = https_opener(args.ca_file) if args.ca_file and os.path.exists(args.ca_file) else OPENER
    found = {}
    for spec in args.instances:
        name, _sep, port = spec.rpartition("=")
        url, text, error = first_read(port, args.address or ["127.0.0.1"], args.timeout, opener)
        found[name or port] = {"url": url, "first": text, "second": None, "error": error, "at": time.monotonic()}
    started = time.monotonic()
    if any(item["first"] is not None for item in found.values()):
        time.sleep(max(0.0, args.seconds))
    for item in found.values():
        if item["first"] is None:
            continue
        try:
            item["second"] = read(item["url"], args.timeout, opener)
            item["seconds"] = round(time.monotonic() - item["at"], 3)
        except (OSError, ValueError) as err:
            item["error"] = f"second read of {item['url']}: {getattr(err, 'reason', err)}"
    for item in found.values():
        del item["at"]
    json.dump({"seconds": round(time.monotonic() - started, 3), "instances": found}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
