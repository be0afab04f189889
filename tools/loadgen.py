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
else is a failure: connection refused or reset, 5xx, timeout, a malformed
status line, a body cut short (fewer bytes than its Content-Length, a chunked
stream that stops), any exception at all. Each is recorded with its time, its
type and its reason (and counted by type), and with --failure-log also
appended to that file (one JSON line each) as it happens. A request still
running --timeout + 5 s after the stop is a failure of type "unfinished", so
sent == answered + failed always holds.
With --long-max-tokens, every --long-every-th request of each worker asks for
that many tokens (ignore_eos, so it generates them all): a request in flight
for a second or more, which a restart without a drain cuts. The requests in
flight are sampled every 0.1 s: their mean, the least seen, and the share of
samples with fewer in flight than --expect-in-flight (the instances behind the
load balancer: a test proves nothing about an instance with no request in it).
The sends per second are counted over windows of --rate-window seconds and
over the run's first and last thirds: the least window's rate and its share of
the first third's (when every worker is still sending; a worker stuck or gone
shows as a fall); --min-rate-share makes a lower share fail the run.
With --lb-sample-cmd (once per load balancer), that shell command runs every
--lb-sample-interval seconds (1) and its output, HAProxy's answer to
`show servers state [BACKEND]` or `show stat` (CSV), or a bare number, gives
the servers UP and ready (op state UP, admin state ready, weight above 0) on
that load balancer; --lb-backend keeps the rows of one backend. The least
count is reported, and a sample with none fails the run, as does a command
none of whose samples could be read.
Runs until --stop-file exists or --duration seconds passed, then writes the
counts, latency percentiles, in-flight figures, send rates, load balancer
samples and failures as JSON and prints a summary. The exit status is 1 when a
worker (or a sampler) died, when the counts disagree, or when a check asked
for above failed (failed requests alone leave it 0: the caller judges them).
Stdlib only, so it runs with any Python 3.10 or later.
"""

import argparse
import csv
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request

UNFINISHED = "unfinished"


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


def error_type(err):
    """The type a failure is counted under: the exception's class, the cause's for urllib's URLError wrapper."""
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code}"
    reason = getattr(err, "reason", None) if isinstance(err, urllib.error.URLError) else None
    if isinstance(reason, BaseException):
        return type(reason).__name__
    return type(err).__name__


def describe(err):
    """(type, reason) of a request that ended in the exception `err`."""
    if isinstance(err, urllib.error.HTTPError):
        try:
            body = repr(err.read()[:200])
        except Exception as unread:  # a 5xx whose body is cut short too: the status is what counts
            body = f"<body unreadable: {type(unread).__name__}: {unread}>"
        return error_type(err), f"HTTP {err.code}: {body}"
    return error_type(err), f"{type(err).__name__}: {err}"


def one_request(url, headers, body, timeout, context=None):
    """None for a whole answer, else (type, reason). Every exception is such a failure, never raised."""
    request = urllib.request.Request(url + "/v1/completions", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            payload = json.loads(response.read())
            if response.status != 200:
                return f"HTTP {response.status}", f"HTTP {response.status}"
            why = judge(payload, json.loads(body))
    except Exception as err:  # IncompleteRead, BadStatusLine, resets, timeouts, bad JSON...: each one is counted
        return describe(err)
    if why is None:
        return None
    return why.split(":", 1)[0], why


def current_headers(args, headers):
    """The headers with the key file's current content: a test moves the client to a rotated key by rewriting it."""
    if not args.api_key_file:
        return headers
    with open(args.api_key_file) as handle:
        return {**headers, "Authorization": "Bearer " + handle.read().strip()}


def record_failure(args, state, started, url, kind, reason):
    """Count one failure (the caller holds the lock) and log it."""
    state["failed"] += 1
    state["failures_by_type"][kind] = state["failures_by_type"].get(kind, 0) + 1
    failure = {
        "at": round(started - state["start"], 1),
        "epoch": round(started, 1),
        "url": url,
        "type": kind,
        "error": reason,
    }
    state["failures"].append(failure)
    if args.failure_log:
        try:
            with open(args.failure_log, "a") as handle:
                handle.write(json.dumps(failure) + "\n")
        except OSError as err:
            if not state["log_failed"]:  # said once: the log misses this failure and maybe later ones
                state["log_failed"] = True
                state["problems"].append(f"--failure-log {args.failure_log}: {type(err).__name__}: {err}")


def send(args, url, headers, body, state, lock, context):
    """One request, counted sent when it leaves and answered or failed when it ends, whatever ends it."""
    started = time.time()
    with lock:
        if state["closed"]:
            return
        state["sent"] += 1
        state["in_flight"] += 1
        state["sends"].append(started)
        ticket = state["tickets"] = state["tickets"] + 1
        state["running"][ticket] = (started, url)
    error = (UNFINISHED, "the worker ended during the request")
    try:
        error = one_request(url, current_headers(args, headers), body, args.timeout, context)
    except Exception as err:  # the key file could not be read, or anything one_request did not foresee
        error = describe(err)
    except BaseException as err:  # the worker is being killed (SystemExit, KeyboardInterrupt): count, then go
        error = describe(err)
        raise
    finally:
        took = time.time() - started
        with lock:
            # After the counts were closed (a request that outlived the wait for it), it is already counted.
            if state["running"].pop(ticket, None) is not None:
                state["in_flight"] -= 1
                if error is None:
                    state["answered"] += 1
                    state["latencies"].append(took)
                else:
                    record_failure(args, state, started, url, *error)


def worker(args, url, headers, bodies, state, lock, stop, context=None):
    sent = 0
    while not stop.is_set():
        body = bodies[1] if args.long_max_tokens and sent % args.long_every == args.long_every - 1 else bodies[0]
        sent += 1
        send(args, url, headers, body, state, lock, context)
        stop.wait(args.pause)


def guarded(name, target, state, lock):
    """`target` run so that whatever ends its thread early is recorded: the run then fails."""

    def run(*args):
        try:
            target(*args)
        except BaseException as err:  # recorded, then the thread ends as it would have
            with lock:
                state["deaths"].append(
                    {"thread": name, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
                )

    return run


def sample_in_flight(state, lock, stop, samples):
    while not stop.wait(0.1):
        with lock:
            samples.append(state["in_flight"])


def server_ready(header, line, backend):
    """1 if the row `line` is a server of `backend` (any without it) that is UP and ready, else 0."""
    if "srv_op_state" in header:  # show servers state: op state 2 is UP, admin state 0 is ready (no maint, no drain)
        row = dict(zip(header, line.split(), strict=False))
        if backend and row["be_name"] != backend:
            return 0
        ready = row["srv_op_state"] == "2" and int(row["srv_admin_state"]) == 0
        return int(ready and int(row.get("srv_uweight", "1")) > 0)
    if "status" in header and "svname" in header:  # show stat: UP (or UP 1/3, going down), not DRAIN or MAINT
        row = dict(zip(header, next(csv.reader([line])), strict=False))
        if row["svname"] in ("FRONTEND", "BACKEND") or (backend and row["pxname"] != backend):
            return 0
        status = row["status"]
        return int((status.startswith("UP") or status == "no check") and int(row.get("weight") or "1") > 0)
    raise ValueError("its header has neither srv_op_state nor svname and status")


def up_and_ready(text, backend=None):
    """Servers UP and ready in one load balancer sample: HAProxy's `show servers state` or `show stat` (CSV)
    answer, or a bare number. Raises ValueError for anything else."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) == 1 and lines[0].strip().isdigit():
        return int(lines[0])
    header, count = None, 0
    for line in lines:
        if line.startswith("#"):
            names = line[1:].strip()
            header = [name.strip() for name in (names.split(",") if "," in names else names.split())]
            continue
        if header is None:
            continue  # `show servers state` starts with its format version
        try:
            count += server_ready(header, line, backend)
        except (KeyError, ValueError) as err:
            raise ValueError(f"the row {line[:120]!r} under the header {' '.join(header[:8])}...: {err!r}") from None
    if header is None:
        raise ValueError(f"neither a number nor a '# ' header line: {text.strip()[:120]!r}")
    return count


def sample_lb(index, command, args, state, lock, stop):
    """Run `command` every --lb-sample-interval seconds; record the servers UP and ready it shows."""
    tick = time.time()
    while not stop.is_set():
        at = time.time()
        try:
            done = subprocess.run(
                command, shell=True, capture_output=True, text=True, timeout=max(5.0, 3 * args.lb_sample_interval),
                check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise ValueError(f"exit status {done.returncode}: {done.stderr.strip()[:200]}")
            up, error = up_and_ready(done.stdout, args.lb_backend), None
        except Exception as err:  # a sample that cannot be read is counted as such; it is not a count of 0
            up, error = None, f"{type(err).__name__}: {err}"
        with lock:
            lb = state["lb"][index]
            if error is not None:
                lb["errors"] += 1
                if len(lb["error_examples"]) < 5:
                    lb["error_examples"].append({"at": round(at - state["start"], 1), "error": error})
            else:
                lb["samples"] += 1
                lb["up_min"] = up if lb["up_min"] is None else min(lb["up_min"], up)
                if up == 0:
                    lb["zero_at"].append(round(at - state["start"], 1))
        tick += args.lb_sample_interval
        now = time.time()
        tick = max(tick, now)  # a command slower than the interval skips ticks; it does not make a burst
        stop.wait(tick - now)


def percentile(values, share):
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 3) if ordered else None


def send_rates(sends, start, end, window=0.0, count=None):
    """Sends per second in `count` equal windows from `start` to `end`, or in windows of at least `window`
    seconds (one window when the run was shorter), and their width."""
    span = end - start
    if span <= 0:
        return [], 0.0
    if count is None:
        count = max(1, int(span // window)) if window > 0 else 1
    width = span / count
    bins = [0] * count
    for at in sends:
        bins[min(count - 1, max(0, int((at - start) / width)))] += 1
    return [round(n / width, 2) for n in bins], width


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
    parser.add_argument(
        "--rate-window", type=float, default=5.0, help="seconds of each window the sends per second are counted over"
    )
    parser.add_argument(
        "--min-rate-share", type=float, default=0.0,
        help="fail if a window's sends per second fall below this share of the median window's (0: report only)",
    )  # fmt: skip
    parser.add_argument(
        "--lb-sample-cmd", action="append", default=[],
        help="shell command printing a load balancer's `show servers state` or `show stat` answer, or a number of "
        "servers UP and ready; run every --lb-sample-interval s; a sample with 0 fails the run (repeat per LB)",
    )  # fmt: skip
    parser.add_argument(
        "--lb-sample-interval", type=float, default=1.0, help="seconds between two load balancer samples"
    )
    parser.add_argument("--lb-backend", help="count only this backend's servers in the load balancer samples")
    args = parser.parse_args()

    headers = {"Content-Type": "application/json"}
    if args.long_every < 1:
        parser.error("--long-every must be 1 or more")
    if args.concurrency < 1:
        parser.error("--concurrency must be 1 or more")
    if args.lb_sample_interval <= 0:
        parser.error("--lb-sample-interval must be above 0")
    short = {"model": args.model, "prompt": "The capital of France is", "max_tokens": args.max_tokens, "temperature": 0}
    long = dict(short, max_tokens=args.long_max_tokens, ignore_eos=True)
    bodies = (json.dumps(short).encode(), json.dumps(long).encode())
    context = None
    if any(url.startswith("https://") for url in args.url):
        context = ssl.create_default_context(cafile=args.ca_file)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
    elif args.ca_file:
        parser.error("--ca-file needs an https:// --url")
    state = {
        "sent": 0, "answered": 0, "failed": 0, "in_flight": 0, "latencies": [], "failures": [],
        "failures_by_type": {}, "sends": [], "tickets": 0, "running": {}, "closed": False, "deaths": [],
        "log_failed": False, "problems": [],
        "lb": [{"samples": 0, "errors": 0, "error_examples": [], "up_min": None, "zero_at": []}
               for _command in args.lb_sample_cmd],
    }  # fmt: skip
    state["start"] = time.time()
    lock, stop, samples = threading.Lock(), threading.Event(), []
    workers = [
        threading.Thread(
            target=guarded(f"worker {i}", worker, state, lock),
            args=(args, args.url[i % len(args.url)], headers, bodies, state, lock, stop, context),
            name=f"worker {i}",
            daemon=True,
        )
        for i in range(args.concurrency)
    ]
    helpers = [
        threading.Thread(
            target=guarded("in-flight sampler", sample_in_flight, state, lock),
            args=(state, lock, stop, samples), name="in-flight sampler", daemon=True,
        )
    ] + [
        threading.Thread(
            target=guarded(f"lb sampler {i}", sample_lb, state, lock),
            args=(i, command, args, state, lock, stop), name=f"lb sampler {i}", daemon=True,
        )
        for i, command in enumerate(args.lb_sample_cmd)
    ]  # fmt: skip
    for thread in workers + helpers:
        thread.start()
    while time.time() - state["start"] < args.duration and not (args.stop_file and os.path.exists(args.stop_file)):
        time.sleep(0.5)
    alive = [thread.is_alive() for thread in workers]
    helpers_alive = [thread.is_alive() for thread in helpers]
    stopped_at = time.time()
    stop.set()
    deadline = stopped_at + args.timeout + 5
    for thread in workers + helpers:
        thread.join(max(0.0, deadline - time.time()))
    with lock:
        # The counts close here: a request still running is a failure, and its worker no longer counts it.
        state["closed"] = True
        unfinished = sorted(state["running"].values())
        state["running"].clear()
        for started, url in unfinished:
            state["in_flight"] -= 1
            record_failure(args, state, started, url, UNFINISHED, f"no answer {args.timeout + 5:g} s after the stop")
        counts = {key: state[key] for key in ("sent", "answered", "failed", "in_flight")}
        failures, by_type, latencies = (
            list(state["failures"]),
            dict(state["failures_by_type"]),
            list(state["latencies"]),
        )
        deaths = list(state["deaths"])
        problems = list(state["problems"])
        sends = list(state["sends"])
        lbs = [dict(lb) for lb in state["lb"]]
    rates, width = send_rates(sends, state["start"], stopped_at, args.rate_window)
    thirds, _unused = send_rates(sends, state["start"], stopped_at, count=3)
    min_rate = min(rates) if rates else 0
    rate_share = round(min_rate / thirds[0], 3) if thirds and thirds[0] else None
    lb_mins = [lb["up_min"] for lb in lbs]

    for i, thread in enumerate(workers):
        if not alive[i]:
            problems.append(f"{thread.name} (to {args.url[i % len(args.url)]}) died before the stop")
    for i, thread in enumerate(helpers):
        if not helpers_alive[i]:
            problems.append(f"the {thread.name} died before the stop")
    problems.extend(f"{death['thread']} ended on {death['error']}" for death in deaths)
    if counts["sent"] != counts["answered"] + counts["failed"]:
        problems.append(f"the counts disagree: {counts}")
    if args.min_rate_share and (rate_share is None or rate_share < args.min_rate_share):
        problems.append(
            f"the send rate fell: the least {round(width, 2)} s window had {min_rate}/s, {rate_share} of the "
            f"first third's {thirds[0] if thirds else 0}/s (--min-rate-share {args.min_rate_share})"
        )
    for command, lb in zip(args.lb_sample_cmd, lbs, strict=True):
        if lb["zero_at"]:
            problems.append(
                f"no server UP and ready at {len(lb['zero_at'])} sample(s) of {command!r}, the first "
                f"{lb['zero_at'][0]} s after the start"
            )
        if not lb["samples"]:
            first = lb["error_examples"][0]["error"] if lb["error_examples"] else "no sample was taken"
            problems.append(f"no sample of {command!r} could be read ({lb['errors']} error(s), the first: {first})")

    result = {
        "urls": args.url,
        "started_at": round(state["start"], 1),
        "seconds": round(time.time() - state["start"], 1),
        "concurrency": args.concurrency,
        "pause_s": args.pause,
        "sent": counts["sent"],
        "answered": counts["answered"],
        "failed": counts["failed"],
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_p95_s": percentile(latencies, 0.95),
        "long_max_tokens": args.long_max_tokens,
        "in_flight_mean": round(sum(samples) / len(samples), 2) if samples else 0,
        "in_flight_min": min(samples, default=0),
        "share_below_expected": round(sum(1 for n in samples if n < args.expect_in_flight) / len(samples), 3)
        if samples
        else 1.0,
        "failures": failures[:50],
        "failures_by_type": dict(sorted(by_type.items())),
        "unfinished": len(unfinished),
        "in_flight_at_end": counts["in_flight"],
        "workers": args.concurrency,
        "workers_alive_at_stop": sum(alive),
        "worker_deaths": deaths,
        "send_rate_window_s": round(width, 2),
        "send_rate_per_s": rates,
        "send_rate_min_per_s": min_rate,
        "send_rate_max_per_s": max(rates, default=0),
        "send_rate_first_third_per_s": thirds[0] if thirds else 0,
        "send_rate_last_third_per_s": thirds[-1] if thirds else 0,
        "send_rate_min_share": rate_share,
        "lb_sample_cmds": args.lb_sample_cmd,
        "lb_samples": sum(lb["samples"] for lb in lbs),
        "lb_sample_errors": sum(lb["errors"] for lb in lbs),
        "lb_sample_error_examples": [example for lb in lbs for example in lb["error_examples"]][:10],
        "lb_up_min": min((n for n in lb_mins if n is not None), default=None),
        "lb_up_min_by_cmd": lb_mins,
        "lb_zero_up_at": [at for lb in lbs for at in lb["zero_at"]][:50],
        "problems": problems,
    }
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=2)
    print(
        f"loadgen: {result['sent']} sent, {result['answered']} answered, {result['failed']} failed "
        f"in {result['seconds']} s (p50 {result['latency_p50_s']} s, p95 {result['latency_p95_s']} s); in flight: "
        f"mean {result['in_flight_mean']}, min {result['in_flight_min']}, below {args.expect_in_flight} "
        f"{result['share_below_expected']:.1%} of the time"
    )
    if result["failures_by_type"]:
        by_type = ", ".join(f"{kind} {n}" for kind, n in result["failures_by_type"].items())
        print(f"loadgen: failures by type: {by_type}")
    print(
        f"loadgen: {result['workers_alive_at_stop']} of {args.concurrency} workers alive at the stop; sends per "
        f"second over {result['send_rate_window_s']} s windows: min {min_rate} ({rate_share} of the first "
        f"third's {result['send_rate_first_third_per_s']}), max {result['send_rate_max_per_s']}; last third "
        f"{result['send_rate_last_third_per_s']}"
    )
    if args.lb_sample_cmd:
        print(
            f"loadgen: load balancers: servers UP and ready, least seen {result['lb_up_min']} (per command "
            f"{lb_mins}) in {result['lb_samples']} samples, {result['lb_sample_errors']} unreadable"
        )
    for problem in problems:
        print(f"loadgen: FAILED: {problem}", file=sys.stderr)
    for death in deaths:
        print(death["traceback"], file=sys.stderr, end="")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
