"""What TLS from the load balancer to the instances costs: tokens/s and latency through the load balancer, with the
hop on HTTPS and on plain HTTP, side by side, on the same fleet.

Run from the repo root after `bash scripts/demo.sh` converged the demo fleet (its instances serve HTTPS: the demo
inventory gives each vLLM host a certificate from the test CA); pass the same -e as the demo got:
  .venv/bin/python benchmarks/backend_tls_cost.py [--write] [-- -e vllm_install_source=index]

1. load with the hop on TLS (as converged);
2. site.yml with `vllm_service_tls_certificate: ""` and `vllm_fleet_backend_network_trusted: true`: the rollout
   switches every host to plain HTTP in its drained window; load again;
3. site.yml as the demo runs it: back to TLS (the fleet ends as it began); load a third time.
Each load is tools/loadgen.py through the load balancer's HTTPS frontend: --concurrency workers, every request
generating --tokens tokens (ignore_eos), for --duration seconds. tokens/s = answered requests x tokens / seconds.
--write replaces the "## TLS to the instances" section of docs/benchmarks.md.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's ansible and ansible-playbook
VAULT = ["--vault-id", "demo@inventories/demo.vault-password"]
PLAIN = {"vllm_service_tls_certificate": "", "vllm_fleet_backend_network_trusted": True}


def run(argv, **kwargs):
    print("+", " ".join(argv), flush=True)
    return subprocess.run(argv, cwd=REPO, check=True, **kwargs)


def lb_url():
    out = subprocess.run(
        ["podman", "inspect", "-f", "{{.NetworkSettings.IPAddress}}", "demo-lb"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return f"https://{out}:8080"


def api_key(work):
    """The demo's key, from the vault, into a 0600 file loadgen reads (never on a command line)."""
    key = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-i", "inventories/demo", *VAULT, "-m", "ansible.builtin.debug",
         "-a", "var=demo_vault_api_key", "-o"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    value = json.loads(key.split("=>", 1)[1])["demo_vault_api_key"]
    path = work / "api-key"
    path.write_text(value)
    path.chmod(0o600)
    return path


def load(name, args, work, key_file):
    out = work / f"{name}.json"
    run(
        [sys.executable, "tools/loadgen.py", "--url", lb_url(), "--ca-file", ".cache/tls/ca.crt",
         "--api-key-file", str(key_file), "--model", "tiny-llama", "--concurrency", str(args.concurrency),
         "--long-max-tokens", str(args.tokens), "--long-every", "1", "--duration", str(args.duration),
         "--out", str(out)]
    )  # fmt: skip
    result = json.loads(out.read_text())
    result["tokens_per_second"] = round(result["answered"] * args.tokens / result["seconds"], 1)
    return result


def site(extra, demo_args):
    run([str(BIN / "ansible-playbook"), *VAULT, "site.yml", *demo_args, *(["-e", json.dumps(extra)] if extra else [])])


def table(results, args):
    lines = [
        f"`benchmarks/backend_tls_cost.py` on {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores,"
        f" the demo fleet (2 vLLM hosts, 1 load balancer, tiny-llama): {args.concurrency} clients through the load"
        f" balancer's HTTPS frontend, each request {args.tokens} tokens, {args.duration:g} s per run.",
        "",
        "| hop load balancer -> instance | answered | failed | tokens/s | latency p50 (s) | p95 (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        lines.append(
            f"| {name} | {result['answered']} | {result['failed']} | {result['tokens_per_second']} |"
            f" {result['latency_p50_s']} | {result['latency_p95_s']} |"
        )
    return "\n".join(lines) + "\n"


def write(text):
    path = REPO / "docs/benchmarks.md"
    doc = path.read_text()
    head = "## TLS to the instances\n"
    body = head + "\nMeasured with `.venv/bin/python benchmarks/backend_tls_cost.py --write`.\n\n" + text
    if head in doc:
        start = doc.index(head)
        end = doc.find("\n## ", start + len(head))
        doc = doc[:start] + body + (doc[end + 1 :] if end != -1 else "")
    else:
        doc = doc.rstrip("\n") + "\n\n" + body
    path.write_text(doc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=120)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--no-return", action="store_true", help="leave the fleet on plain HTTP (no third run)")
    parser.add_argument("demo_args", nargs="*", help="after --: what the demo got, e.g. -e vllm_install_source=index")
    args = parser.parse_args()
    work = REPO / "reports" / "backend-tls-cost"
    work.mkdir(parents=True, exist_ok=True)
    key_file = api_key(work)
    results = {"TLS (as converged)": load("tls", args, work, key_file)}
    site(PLAIN, args.demo_args)
    results["plain HTTP"] = load("plain", args, work, key_file)
    if not args.no_return:
        site(None, args.demo_args)
        results["TLS again"] = load("tls-again", args, work, key_file)
    text = table(results, args)
    print(text)
    (work / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    if args.write:
        write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
