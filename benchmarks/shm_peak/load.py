"""N (default 20) completions against a vLLM OpenAI server: CONCURRENCY (default 3) concurrent, half with max_tokens 64,
every 4th streamed, ignore_eos so every request really generates max_tokens tokens.

Usage: load.py PORT OUT.json [CONCURRENCY] [N_REQUESTS]
"""
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import requests

PORT = int(sys.argv[1])
OUT = sys.argv[2]
CONC = int(sys.argv[3]) if len(sys.argv) > 3 else 3
N = int(sys.argv[4]) if len(sys.argv) > 4 else 20
URL = f"http://127.0.0.1:{PORT}/v1/completions"


def one(i):
    words = "the quick brown fox jumps over the lazy dog and then sits down to think about it"
    prompt = f"Request {i}: " + " ".join([words] * (1 + (i % 5) * 4))  # up to ~300 tokens
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": 64 if i % 2 == 0 else 16,
        "temperature": 0.8,
        "ignore_eos": True,
        "stream": i % 4 == 2,  # 2, 6, 10, 14, 18 for N=20
    }
    t = time.time()
    r = requests.post(URL, json=body, timeout=300, stream=body["stream"])
    r.raise_for_status()
    if body["stream"]:
        chunks = 0
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunks += 1
        res = {"i": i, "stream": True, "chunks": chunks}
    else:
        j = r.json()
        res = {"i": i, "stream": False, "completion_tokens": j["usage"]["completion_tokens"],
               "prompt_tokens": j["usage"]["prompt_tokens"]}
    res.update(max_tokens=body["max_tokens"], secs=round(time.time() - t, 3), status=r.status_code)
    return res


def main():
    t0 = time.time()
    with ThreadPoolExecutor(CONC) as ex:
        results = list(ex.map(one, range(N)))
    summary = {"concurrency": CONC, "total_secs": round(time.time() - t0, 3), "results": results}
    with open(OUT, "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
