#!/usr/bin/env python3
"""A short benchmark through a load balancer for the fleet report (playbooks/report.yml, report_benchmark=true).

    FLEET_REPORT_API_KEY=... fleet_report_bench.py --url https://lb:8080 --ca /etc/haproxy/tls/ca.crt \
        --concurrency 1,4,16 --max-tokens 32

The same fixed prompts at each concurrency, as streamed completions (/v1/completions, "stream": true): the time
to the first streamed token (TTFT) of every request, and the output tokens per second of the whole level (the
usage the last chunk reports, else one token per chunk). The API key comes from the environment, never from
the command line. Prints JSON: {"through", "model", "prompts", "max_tokens", "levels": [{"concurrency",
"requests", "errors", "seconds", "output_tokens", "tokens_per_s", "ttft_p50_s", "ttft_p95_s", "error"}],
"error"}. Standard library only.
"""

import argparse
import concurrent.futures
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request

PROMPTS = (
    "The capital of France is",
    "Write one sentence about the sea.",
    "List three prime numbers:",
    "A CPU cache is",
    "Translate 'good morning' into German:",
    "The opposite of hot is",
    "Once upon a time, in a small village,",
    "The quick brown fox",
)


def percentile(values, share):
    """Linear interpolation between the closest ranks (numpy's default); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * share
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class Client:
    def __init__(self, url, ca, key, timeout):
        self.url = url.rstrip("/")
        self.context = ssl.create_default_context(cafile=ca or None) if url.startswith("https:") else None
        self.headers = {"Content-Type": "application/json"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.timeout = timeout
        # The load balancer this runs on: never through a proxy the environment may name.
        handlers = [urllib.request.ProxyHandler({})]
        if self.context:
            handlers.append(urllib.request.HTTPSHandler(context=self.context))
        self.opener = urllib.request.build_opener(*handlers)

    def open(self, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, headers=self.headers)
        return self.opener.open(request, timeout=self.timeout)

    def model(self):
        with self.open("/v1/models") as answer:
            return json.load(answer)["data"][0]["id"]

    def completion(self, model, prompt, max_tokens):
        """(ttft seconds or None, output tokens) of one streamed completion."""
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        started = time.monotonic()
        ttft, chunks, usage = None, 0, None
        with self.open("/v1/completions", body) as answer:
            for raw in answer:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if chunk.get("usage"):
                    usage = chunk["usage"].get("completion_tokens")
                if any(choice.get("text") for choice in chunk.get("choices") or []):
                    chunks += 1
                    if ttft is None:
                        ttft = time.monotonic() - started
        return ttft, usage if usage is not None else chunks


def _reason(err):
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    return str(getattr(err, "reason", err))[:200]


def level(client, model, concurrency, requests, max_tokens):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]
    ttfts, tokens, errors = [], 0, []
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(client.completion, model, prompt, max_tokens) for prompt in prompts]
        for future in futures:
            try:
                ttft, count = future.result()
            except (OSError, ValueError, KeyError) as err:
                errors.append(_reason(err))
                continue
            tokens += count
            if ttft is not None:
                ttfts.append(ttft)
    seconds = time.monotonic() - started
    return {
        "concurrency": concurrency,
        "requests": requests,
        "errors": len(errors),
        "seconds": round(seconds, 3),
        "output_tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None,
        "ttft_p50_s": None if not ttfts else round(percentile(ttfts, 0.5), 4),
        "ttft_p95_s": None if not ttfts else round(percentile(ttfts, 0.95), 4),
        "error": errors[0] if errors else "",
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the load balancer, https://name:port or http://127.0.0.1:port")
    parser.add_argument("--ca", default="", help="CA certificate file that signed the load balancer's certificate")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=2, help="requests per level: rounds x concurrency (at least 4)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--model", default="", help="default: the first model /v1/models lists")
    args = parser.parse_args(argv)
    result = {
        "through": args.url,
        "model": args.model,
        "prompts": len(PROMPTS),
        "max_tokens": args.max_tokens,
        "levels": [],
        "error": "",
    }
    client = Client(args.url, args.ca, os.environ.get("FLEET_REPORT_API_KEY", ""), args.timeout)
    try:
        result["model"] = args.model or client.model()
        for concurrency in (int(c) for c in args.concurrency.split(",") if c.strip()):
            requests = max(4, args.rounds * concurrency)
            result["levels"].append(level(client, result["model"], concurrency, requests, args.max_tokens))
    except (OSError, ValueError, KeyError, IndexError) as err:
        result["error"] = _reason(err)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
