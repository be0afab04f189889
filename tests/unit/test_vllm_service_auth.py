"""roles/vllm_service/files/vllm_service_auth.py: every route needs the key except the open paths,
whatever vLLM itself checks; websockets too; no key configured refuses every route but the open
paths (closed, not open), unless serving without a key was chosen explicitly."""

import asyncio
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "vllm_service_auth.py"
spec = importlib.util.spec_from_file_location("vllm_service_auth", SCRIPT)
auth = importlib.util.module_from_spec(spec)
spec.loader.exec_module(auth)

KEYS = {"VLLM_SERVICE_API_KEY": "new-key", "VLLM_SERVICE_OPEN_PATHS": "/health /metrics"}


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


NO_KEY = {"VLLM_SERVICE_OPEN_PATHS": "/health /metrics"}


@pytest.mark.parametrize(
    "environ",
    [
        NO_KEY,
        dict(NO_KEY, VLLM_SERVICE_API_KEY=""),
        dict(NO_KEY, VLLM_SERVICE_ALLOW_UNAUTHENTICATED="0"),
        # The name vLLM reads is no key of ours while secrets.env has our own (even empty).
        dict(NO_KEY, VLLM_SERVICE_API_KEY="", VLLM_API_KEY="new-key"),
    ],
    ids=["absent", "empty", "not-allowed", "only-vllms-name"],
)
@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/v1/completions", "/", "/health/"])
def test_no_key_configured_refuses_every_route_but_the_open_paths(environ, path):
    # secrets.env lost, emptied or unreadable: vLLM then checks nothing, the middleware refuses.
    for authorization in (None, "", "Bearer ", "Bearer new-key", "Bearer anything"):
        assert call(environ, path, authorization) == (401, b'{"error": "Unauthorized"}'), (path, authorization)
    assert call(environ, path, kind="websocket") == (1008, b"")
    assert call(environ, "/health") == (200, b"generated")
    assert call(environ, "/metrics") == (200, b"generated")


def test_no_key_configured_is_said_in_the_log(caplog):
    with caplog.at_level("ERROR"):
        auth.RequireApiKey(inner_app, environ=NO_KEY)
    assert "no API key" in caplog.text and "/health" in caplog.text
    caplog.clear()
    auth.RequireApiKey(inner_app, environ=KEYS)
    assert not caplog.text


def test_serving_without_a_key_needs_the_explicit_choice():
    # What secrets.env.j2 writes for vllm_service_allow_unauthenticated: true and an empty key.
    allowed = dict(NO_KEY, VLLM_SERVICE_ALLOW_UNAUTHENTICATED="1")
    assert call(allowed, "/tokenize") == (200, b"generated")
    assert call(allowed, "/v1/completions", "Bearer whatever") == (200, b"generated")
    # A key wins over the choice: the key is required.
    assert call(dict(KEYS, VLLM_SERVICE_ALLOW_UNAUTHENTICATED="1"), "/tokenize")[0] == 401


def test_lifespan_passes_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(auth.RequireApiKey(app, environ=KEYS)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


def test_a_malformed_open_path_fails_at_start():
    with pytest.raises(ValueError, match="VLLM_SERVICE_OPEN_PATHS"):
        auth.RequireApiKey(inner_app, environ={"VLLM_SERVICE_API_KEY": "k", "VLLM_SERVICE_OPEN_PATHS": "health"})


def test_the_keys_come_from_names_vllm_does_not_read():
    # vLLM reads VLLM_API_KEY (and logs --api-key/--config values before 0.29): the role's keys never go there.
    assert "VLLM_API_KEY" not in auth.KEY_VARIABLES
    assert call(KEYS, "/v1/completions", "Bearer new-key")[0] == 200
    assert call(dict(KEYS, VLLM_API_KEY="vllms-own"), "/tokenize", "Bearer vllms-own")[0] == 401


def test_a_rolled_back_secrets_file_of_an_earlier_version_still_serves():
    # A snapshot taken before the rename holds VLLM_API_KEY (and the previous key under its own name).
    earlier = {"VLLM_API_KEY": "old-name-key", "VLLM_SERVICE_PREVIOUS_API_KEY": "older", "VLLM_SERVICE_OPEN_PATHS": ""}
    assert call(earlier, "/tokenize", "Bearer old-name-key")[0] == 200
    assert call(earlier, "/tokenize", "Bearer older")[0] == 200
    assert call(earlier, "/tokenize", "Bearer other")[0] == 401
