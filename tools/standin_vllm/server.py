"""A stand-in for one vLLM instance: a real HTTP server with vLLM's routes, for fleets two cores cannot hold.

The fleet-shaped Molecule scenario (molecule/day2_fleet) runs a dozen vLLM hosts on a 2-core machine; real
vLLM needs a core and seconds of warm-up per instance, so these hosts serve this instead, installed as the
distribution `vllm` (tools/standin_wheelhouse.py) and started by the same units, with the same key middleware
(--middleware, loaded as vLLM loads it: a class wraps the ASGI app), the same TLS flags and the same firewall.
What it keeps of vLLM's behaviour, because the rollout depends on it:

- the port opens only after a start-up time (VLLM_STANDIN_STARTUP_SECONDS, default 2): /health refuses
  connections until the "engine" is loaded, as vLLM's does;
- POST /v1/completions and /v1/chat/completions generate max_tokens tokens (default 16) one every
  VLLM_STANDIN_TOKEN_SECONDS (default 0.02), streamed (server-sent events, as vLLM's) or not;
- SIGTERM ends the process at once: a generation in flight is cut mid-answer, as vLLM's shutdown cuts it, so
  an undrained restart loses requests (the scenario's negative control);
- GET /metrics has vLLM's names (vllm:num_requests_running, ..., with model_name), which the monitoring rules,
  the drain and the report read; /version, /v1/models, /tokenize, /detokenize and /invocations answer.

VLLM_STANDIN_FAIL=health|completions makes a start that a health gate refuses (a "bad wheel"): /health never
answers 200, or every completion answers 500. It is not vLLM: no model is loaded (the model directory is only
checked to exist) and the text is made up.
"""

import argparse
import asyncio
import importlib
import json
import os
import sys
import threading
import time

STARTED = time.time()
COUNTS = {"running": 0, "waiting": 0, "generation_tokens": 0, "prompt_tokens": 0, "success": 0}
LOCK = threading.Lock()


def _parser():
    parser = argparse.ArgumentParser(prog="vllm serve (stand-in)")
    parser.add_argument("model", nargs="?")
    parser.add_argument("--model", dest="model_option")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--middleware", action="append", default=[])
    parser.add_argument("--ssl-certfile")
    parser.add_argument("--ssl-keyfile")
    return parser


def _env_float(name, default):
    value = os.environ.get(name, "")
    try:
        return float(value) if value else default
    except ValueError:
        sys.exit(f"vllm stand-in: {name}={value!r} is not a number")


class App:
    """vLLM's routes as a plain ASGI application."""

    def __init__(self, model, version):
        self.model = model
        self.version = version
        self.token_seconds = _env_float("VLLM_STANDIN_TOKEN_SECONDS", 0.02)
        self.fail = os.environ.get("VLLM_STANDIN_FAIL", "")

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path, method = scope["path"], scope["method"]
        if path == "/health":
            await self.reply(send, 503 if self.fail == "health" else 200, b"", "text/plain")
        elif path == "/metrics":
            await self.reply(send, 200, self.metrics().encode(), "text/plain; version=0.0.4")
        elif path == "/version":
            await self.json(send, 200, {"version": self.version})
        elif path == "/v1/models":
            await self.json(send, 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        elif path in ("/tokenize", "/detokenize"):
            await self.json(send, 200, {"tokens": [1, 2, 3], "count": 3, "prompt": "stand-in"})
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions", "/invocations"):
            await self.generate(send, path, body)
        else:
            await self.json(send, 404, {"detail": "Not Found"})

    async def reply(self, send, status, body, content_type):
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def json(self, send, status, payload):
        await self.reply(send, status, json.dumps(payload).encode(), "application/json")

    async def generate(self, send, path, body):
        try:
            request = json.loads(body or b"{}")
            tokens = int(request.get("max_tokens") or request.get("max_completion_tokens") or 16)
        except (ValueError, TypeError, AttributeError):
            await self.json(send, 400, {"error": {"message": "the body is not a JSON completion request"}})
            return
        if self.fail == "completions":
            await self.json(send, 500, {"error": {"message": "stand-in: VLLM_STANDIN_FAIL=completions"}})
            return
        chat = path == "/v1/chat/completions"
        with LOCK:
            COUNTS["running"] += 1
            COUNTS["prompt_tokens"] += 4
        try:
            if request.get("stream"):
                await self.stream(send, tokens, chat)
            else:
                for _unused in range(tokens):
                    await asyncio.sleep(self.token_seconds)
                    with LOCK:
                        COUNTS["generation_tokens"] += 1
                text = " tok" * tokens
                choice = {"index": 0, "finish_reason": "length"}
                choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
                await self.json(
                    send,
                    200,
                    {
                        "id": "cmpl-standin",
                        "object": "chat.completion" if chat else "text_completion",
                        "model": self.model,
                        "choices": [choice],
                        "usage": {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": 4 + tokens},
                    },
                )
            with LOCK:
                COUNTS["success"] += 1
        finally:
            with LOCK:
                COUNTS["running"] -= 1

    async def stream(self, send, tokens, chat):
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for index in range(tokens):
            await asyncio.sleep(self.token_seconds)
            with LOCK:
                COUNTS["generation_tokens"] += 1
            last = index == tokens - 1
            choice = {"index": 0, "finish_reason": "length" if last else None}
            choice.update({"delta": {"content": " tok"}} if chat else {"text": " tok"})
            chunk = {"id": "cmpl-standin", "model": self.model, "choices": [choice]}
            await send(
                {"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(), "more_body": True}
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    def metrics(self):
        labels = f'engine="0",model_name="{self.model}"'
        with LOCK:
            counts = dict(COUNTS)
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {counts['running']}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {counts['waiting']}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} {min(counts['running'], 10) / 10}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{labels}}} {counts['generation_tokens']}",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{labels}}} {counts['prompt_tokens']}",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{labels},finished_reason="length"}} {counts["success"]}',
        ]
        for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
            lines.append(f"# TYPE vllm:{name} histogram")
            for bucket in ("0.1", "1.0", "+Inf"):
                lines.append(f'vllm:{name}_bucket{{{labels},le="{bucket}"}} {counts["success"]}')
            lines += [f"vllm:{name}_sum{{{labels}}} 0", f"vllm:{name}_count{{{labels}}} {counts['success']}"]
        return "\n".join(lines) + "\n"


def _middleware(path):
    """vLLM's --middleware: a dotted path; a class wraps the app (app.add_middleware), as vLLM does."""
    module, _sep, name = path.rpartition(".")
    if not module:
        sys.exit(f"vllm stand-in: --middleware {path!r} is not module.name")
    return getattr(importlib.import_module(module), name)


def serve(argv, version):
    """Parse vLLM's arguments (those this stand-in does not use are accepted and ignored) and serve."""
    args, _ignored = _parser().parse_known_args(argv)
    model_path = args.model or args.model_option
    if not model_path:
        sys.exit("vllm stand-in: no model given")
    if model_path.startswith("/") and not os.path.isdir(model_path):
        sys.exit(f"vllm stand-in: the model directory {model_path} does not exist")
    import uvicorn  # the stand-in's one dependency besides the standard library

    app = App((args.served_model_name or [model_path])[0], version)
    for path in args.middleware:
        app = _middleware(path)(app)
    # vLLM opens its port once the engine is up: until then a connection is refused.
    time.sleep(_env_float("VLLM_STANDIN_STARTUP_SECONDS", 2.0))
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=30,
    )
    server = uvicorn.Server(config)

    def cut(_signum, _frame):
        # vLLM's shutdown aborts the running generations: their answers end mid-body.
        os._exit(0)

    server.handle_exit = cut
    print(f"vllm stand-in {version}: serving {app} on {args.host}:{args.port}", flush=True)
    server.run()
