"""roles/vllm_service/files/vllm_service_auth.py: every route needs the key except the open paths,
whatever vLLM itself checks; websockets too; no key configured means no check (as vLLM)."""

import asyncio
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "vllm_service_auth.py"
spec = importlib.util.spec_from_file_location("vllm_service_auth", SCRIPT)
auth = importlib.util.module_from_spec(spec)
spec.loader.exec_module(auth)

KEYS = {"VLLM_API_KEY": "new-key", "VLLM_SERVICE_OPEN_PATHS": "/health /metrics"}


async def inner_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"generated"})


def call(environ, path, authorization=None, kind="http"):
    """(status or close code, body) of one request through the middleware."""
    headers = [(b"host", b"x")]
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    middleware = auth.RequireApiKey(inner_app, environ=environ)
    asyncio.run(middleware({"type": kind, "path": path, "headers": headers}, receive, send))
    if sent[0]["type"] == "websocket.close":
        return sent[0]["code"], b""
    return sent[0]["status"], sent[1]["body"]


@pytest.mark.parametrize(
    "path", ["/invocations", "/tokenize", "/detokenize", "/v1/completions", "/pooling", "/", "/metrics/"]
)
def test_routes_outside_the_open_paths_need_the_key(path):
    assert call(KEYS, path) == (401, b'{"error": "Unauthorized"}')
    assert call(KEYS, path, "Bearer wrong-key")[0] == 401
    assert call(KEYS, path, "Basic new-key")[0] == 401
    assert call(KEYS, path, "Bearer new-key") == (200, b"generated")


@pytest.mark.parametrize("path", ["/health", "/metrics"])
def test_open_paths_answer_without_the_key(path):
    assert call(KEYS, path) == (200, b"generated")


def test_open_paths_match_exactly():
    for path in ("/health/", "//health", "/HEALTH", "/health/../tokenize", "/healthz"):
        assert call(KEYS, path)[0] == 401, path


def test_the_previous_key_is_accepted_only_while_it_is_set():
    rotating = dict(KEYS, VLLM_SERVICE_PREVIOUS_API_KEY="old-key")
    assert call(rotating, "/tokenize", "Bearer old-key")[0] == 200
    assert call(rotating, "/tokenize", "Bearer new-key")[0] == 200
    assert call(KEYS, "/tokenize", "Bearer old-key")[0] == 401


def test_scheme_is_case_insensitive_and_extra_spaces_are_ignored():
    assert call(KEYS, "/tokenize", "bearer new-key")[0] == 200
    assert call(KEYS, "/tokenize", "Bearer  new-key ")[0] == 200
    assert call(KEYS, "/tokenize", "Bearer")[0] == 401
    assert call(KEYS, "/tokenize", "")[0] == 401


def test_websockets_without_the_key_are_closed_before_the_handshake():
    assert call(KEYS, "/v1/realtime", kind="websocket") == (1008, b"")


def test_no_key_configured_checks_nothing_like_vllm():
    assert call({"VLLM_SERVICE_OPEN_PATHS": "/health"}, "/tokenize") == (200, b"generated")


def test_lifespan_passes_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(auth.RequireApiKey(app, environ=KEYS)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


def test_a_malformed_open_path_fails_at_start():
    with pytest.raises(ValueError, match="VLLM_SERVICE_OPEN_PATHS"):
        auth.RequireApiKey(inner_app, environ={"VLLM_API_KEY": "k", "VLLM_SERVICE_OPEN_PATHS": "health"})
