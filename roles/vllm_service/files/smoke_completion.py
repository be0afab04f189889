#!/usr/bin/env python3
"""Send CONCURRENCY completions at once to a vLLM instance and wait for all of them.

Usage: smoke_completion.py PORT MODEL MAX_TOKENS CONCURRENCY TIMEOUT_SECONDS
The prompt comes from VLLM_SMOKE_PROMPT, the address from VLLM_SMOKE_HOST
(default 127.0.0.1) and the API key, if any, from the instances' own secrets
file named by VLLM_SMOKE_SECRETS_FILE (so a rolled-back host is checked with the
key it serves with), else from VLLM_SERVICE_API_KEY; never from the command line. Concurrent requests make the
instance run batched steps before a load balancer sends it real traffic, so
work a fresh instance does on its first batches happens inside the health gate.
HTTPS when the instance's unit (VLLM_SMOKE_UNIT) serves it, checked against the
fleet's CA (VLLM_PROBE_CA_FILE).
Prints one JSON object {"ok", "completed", "seconds", "text", "errors"} and
exits 0 only when every request answered 200 with generated tokens.
"""

import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def tls_context():
    """For an instance whose unit serves HTTPS (VLLM_SMOKE_UNIT's --ssl-certfile): its certificate checked against
    the fleet's CA (VLLM_PROBE_CA_FILE), not its name (this host probes itself). None for plain HTTP."""
    unit = os.environ.get("VLLM_SMOKE_UNIT", "")
    if not unit:
        return None
    shown = subprocess.run(["systemctl", "show", "-p", "ExecStart", unit], capture_output=True, text=True, check=False)
    if "--ssl-certfile" not in shown.stdout:
        return None
    context = ssl.create_default_context(cafile=os.environ.get("VLLM_PROBE_CA_FILE", "/etc/vllm/tls-ca.crt"))
    context.check_hostname = False
    return context


def complete(port, model, max_tokens, timeout, prompt, key, context=None):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    host = os.environ.get("VLLM_SMOKE_HOST", "127.0.0.1")
    host = f"[{host}]" if ":" in host else host
    scheme = "https" if context else "http"
    request = urllib.request.Request(f"{scheme}://{host}:{port}/v1/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as err:
        return None, f"HTTP {err.code}: {err.read()[:200]!r}"
    except (OSError, ValueError) as err:
        return None, f"{type(err).__name__}: {err}"
    if answer.get("usage", {}).get("completion_tokens", 0) > 0 and answer.get("choices"):
        return answer["choices"][0].get("text", ""), None
    return None, "answer without generated tokens"


def key_from_secrets(path):
    """The key of an EnvironmentFile written by secrets.env.j2 (value JSON-quoted): VLLM_SERVICE_API_KEY, or
    VLLM_API_KEY in a file of an earlier version of the role that a rollback put back (as the middleware reads it)."""
    found = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                name, _sep, value = line.strip().partition("=")
                if name in ("VLLM_SERVICE_API_KEY", "VLLM_API_KEY"):
                    value = value.strip()
                    found[name] = json.loads(value) if value.startswith('"') else value
    except FileNotFoundError:
        return ""
    return found.get("VLLM_SERVICE_API_KEY", found.get("VLLM_API_KEY", ""))


def main(port, model, max_tokens, concurrency, timeout):
    prompt = os.environ.get("VLLM_SMOKE_PROMPT", "Hello")
    secrets = os.environ.get("VLLM_SMOKE_SECRETS_FILE", "")
    key = key_from_secrets(secrets) if secrets else os.environ.get("VLLM_SERVICE_API_KEY", "")
    results = [None] * concurrency
    try:
        context = tls_context()
    except OSError as err:
        print(
            json.dumps(
                {
                    "ok": False,
                    "completed": 0,
                    "seconds": 0,
                    "text": "",
                    "errors": [f"the instance serves HTTPS, and its CA file cannot be read ({err})"],
                }
            )
        )
        return 1

    def run(index):
        results[index] = complete(port, model, max_tokens, timeout, prompt, key, context)

    started = time.time()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5)
    results = [r if r is not None else (None, "no answer") for r in results]
    errors = [error for _unused, error in results if error]
    texts = [text for text, error in results if not error]
    print(
        json.dumps(
            {
                "ok": not errors,
                "completed": len(texts),
                "seconds": round(time.time() - started, 1),
                "text": texts[0] if texts else "",
                "errors": errors,
            }
        )
    )
    return 0 if not errors else 1


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(int(args[0]), args[1], int(args[2]), int(args[3]), int(args[4])))
