#!/usr/bin/env python3
"""Send completions through a load balancer until told to stop; count every answer.

  python3 tools/loadgen.py --url https://LB:8080 --ca-file .cache/tls/ca.crt \
      --api-key-file KEYFILE --model tiny-llama --concurrency 2 --stop-file /tmp/stop --out result.json

An https URL is verified against --ca-file (the CA that signed the load
balancer's certificate), or the system's trust store without it.

Each worker sends one request after another (a new connection each, like
independent clients), worker i to the i-th --url (round robin: one --url per
load balancer spreads the clients over all of them), waiting --pause seconds between two (the default 0
saturates a small machine; a pause leaves CPU to what is being tested).
A request counts as answered only with HTTP 200 and a completion that ended on
its own terms: finish_reason "stop" or "length", and every token a long
(ignore_eos) request asked for. vLLM answers a request its engine aborted (a
restart without a drain, with shutdown_timeout 0) with HTTP 200, the text so
far and finish_reason "abort": for a client that is a lost answer. Anything
else (connection refused or reset, 5xx, timeout, malformed or cut-short body)
is a failure, recorded with its time and reason, and with --failure-log also
appended to that file (one JSON line each) as it happens.
With --long-max-tokens, every --long-every-th request of each worker asks for
that many tokens (ignore_eos, so it generates them all): a request in flight
for a second or more, which a restart without a drain cuts. The requests in
flight are sampled every 0.1 s: their mean, the least seen, and the share of
samples with fewer in flight than --expect-in-flight (the instances behind the
load balancer: a test proves nothing about an instance with no request in it).
Runs until --stop-file exists or --duration seconds passed, then writes the
counts, latency percentiles, in-flight figures and failures as JSON and prints
a summary line.
Stdlib only, so it runs with any Python 3.
"""

import argparse
import json
import os
import ssl
import threading
import time
import urllib.error
import urllib.request


def judge(payload, asked):
    """Why a completion body is not a whole answer to the request `asked`, or None."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not choices or not isinstance(choices[0], dict):
        return "no completion in the body"
    reason = choices[0].get("finish_reason")
    if reason not in ("stop", "length"):
        return f"cut short: finish_reason {reason!r}"
    if asked.get("ignore_eos"):
        tokens = (payload.get("usage") or {}).get("completion_tokens")
        if tokens != asked["max_tokens"]:
            return f"cut short: {tokens} of {asked['max_tokens']} tokens"
    return None


def one_request(url, headers, body, timeout, context=None):
    request = urllib.request.Request(url + "/v1/completions", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            payload = json.loads(response.read())
            if response.status != 200:
                return f"HTTP {response.status}"
            return judge(payload, json.loads(body))
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}: {err.read()[:200]!r}"
    except (OSError, ValueError) as err:
        return f"{type(err).__name__}: {err}"


def current_headers(args, headers):
    """The headers with the key file's current content: a test moves the client to a rotated key by rewriting it."""
    if not args.api_key_file:
        return headers
    with open(args.api_key_file) as handle:
        return {**headers, "Authorization": "Bearer " + handle.read().strip()}


def worker(args, url, headers, bodies, state, lock, stop, context=None):
    sent = 0
    while not stop.is_set():
        body = bodies[1] if args.long_max_tokens and sent % args.long_every == args.long_every - 1 else bodies[0]
        sent += 1
        started = time.time()
        with lock:
            state["in_flight"] += 1
        error = one_request(url, current_headers(args, headers), body, args.timeout, context)
        took = time.time() - started
        with lock:
            state["in_flight"] -= 1
            state["sent"] += 1
            if error is None:
                state["answered"] += 1
                state["latencies"].append(took)
            else:
                state["failed"] += 1
                failure = {
                    "at": round(started - state["start"], 1),
                    "epoch": round(started, 1),
                    "url": url,
                    "error": error,
                }
                state["failures"].append(failure)
                if args.failure_log:
                    with open(args.failure_log, "a") as handle:
                        handle.write(json.dumps(failure) + "\n")
        stop.wait(args.pause)


def sample_in_flight(state, lock, stop, samples):
    while not stop.wait(0.1):
        with lock:
            samples.append(state["in_flight"])


def percentile(values, share):
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 3) if ordered else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, action="append", help="load balancer URL (repeat for several)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key-file", help="file with the API key (off the command line; read for every request)")
    parser.add_argument("--ca-file", help="CA certificate (PEM) that signed the load balancer's certificate")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--long-max-tokens", type=int, default=0, help="tokens of the long requests (0: none)")
    parser.add_argument("--long-every", type=int, default=3, help="every n-th request of a worker is long")
    parser.add_argument("--expect-in-flight", type=int, default=1, help="requests that should always be in flight")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds each worker waits between two requests")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--stop-file")
    parser.add_argument("--duration", type=float, default=3600)
    parser.add_argument("--out", required=True)
    parser.add_argument("--failure-log", help="file each failure is appended to (a JSON line) as it happens")
    args = parser.parse_args()

    headers = {"Content-Type": "application/json"}
    if args.long_every < 1:
        parser.error("--long-every must be 1 or more")
    short = {"model": args.model, "prompt": "The capital of France is", "max_tokens": args.max_tokens, "temperature": 0}
    long = dict(short, max_tokens=args.long_max_tokens, ignore_eos=True)
    bodies = (json.dumps(short).encode(), json.dumps(long).encode())
    context = None
    if any(url.startswith("https://") for url in args.url):
        context = ssl.create_default_context(cafile=args.ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
    elif args.ca_file:
        parser.error("--ca-file needs an https:// --url")
    state = {"sent": 0, "answered": 0, "failed": 0, "in_flight": 0, "latencies": [], "failures": []}
    state["start"] = time.time()
    lock, stop, samples = threading.Lock(), threading.Event(), []
    threads = [
        threading.Thread(
            target=worker,
            args=(args, args.url[i % len(args.url)], headers, bodies, state, lock, stop, context),
            daemon=True,
        )
        for i in range(args.concurrency)
    ]
    threads.append(threading.Thread(target=sample_in_flight, args=(state, lock, stop, samples), daemon=True))
    for thread in threads:
        thread.start()
    while time.time() - state["start"] < args.duration and not (args.stop_file and os.path.exists(args.stop_file)):
        time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(args.timeout + 5)
    result = {
        "urls": args.url,
        "started_at": round(state["start"], 1),
        "seconds": round(time.time() - state["start"], 1),
        "concurrency": args.concurrency,
        "pause_s": args.pause,
        "sent": state["sent"],
        "answered": state["answered"],
        "failed": state["failed"],
        "latency_p50_s": percentile(state["latencies"], 0.5),
        "latency_p95_s": percentile(state["latencies"], 0.95),
        "long_max_tokens": args.long_max_tokens,
        "in_flight_mean": round(sum(samples) / len(samples), 2) if samples else 0,
        "in_flight_min": min(samples, default=0),
        "share_below_expected": round(sum(1 for n in samples if n < args.expect_in_flight) / len(samples), 3)
        if samples
        else 1.0,
        "failures": state["failures"][:50],
    }
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=2)
    print(
        f"loadgen: {result['sent']} sent, {result['answered']} answered, {result['failed']} failed "
        f"in {result['seconds']} s (p50 {result['latency_p50_s']} s, p95 {result['latency_p95_s']} s); in flight: "
        f"mean {result['in_flight_mean']}, min {result['in_flight_min']}, below {args.expect_in_flight} "
        f"{result['share_below_expected']:.1%} of the time"
    )


if __name__ == "__main__":
    main()
