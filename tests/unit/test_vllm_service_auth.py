"""roles/vllm_service/files/vllm_service_auth.py: every route needs the key except the open paths,
whatever vLLM itself checks; websockets too; no key configured refuses every route but the open
paths (closed, not open), unless serving without a key was chosen explicitly."""

import asyncio
import importlib.util
import os
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


# podman < 5.3 mounts the key as a file (vllm_container.secret_style "mount") and names it in NAME_FILE.
FILE_KEY = "3f9c1e7a5b2d8f604e1a9c7b3d5f2e8a"


def key_file(tmp_path, content, name="VLLM_SERVICE_API_KEY"):
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


def with_file(tmp_path, content, name="VLLM_SERVICE_API_KEY", **more):
    return dict(NO_KEY, **{f"{name}_FILE": key_file(tmp_path, content, name)}, **more)


def refuses_every_key(environ, *keys):
    for key in (None, *keys):
        assert call(environ, "/tokenize", key and f"Bearer {key}") == (401, b'{"error": "Unauthorized"}'), key
    assert call(environ, "/v1/realtime", f"Bearer {FILE_KEY}", kind="websocket") == (1008, b"")
    assert call(environ, "/health") == (200, b"generated")


@pytest.mark.parametrize("content", [FILE_KEY.encode(), f"{FILE_KEY}\n".encode()], ids=["exact", "one-newline"])
def test_the_key_is_read_from_its_file(tmp_path, content):
    environ = with_file(tmp_path, content)
    assert call(environ, "/v1/completions", f"Bearer {FILE_KEY}") == (200, b"generated")
    assert call(environ, "/tokenize", f"Bearer {FILE_KEY}x")[0] == 401
    assert call(environ, "/tokenize", "Bearer wrong-key")[0] == 401
    assert call(environ, "/tokenize")[0] == 401


def test_the_file_is_byte_exact_but_for_one_trailing_newline(tmp_path):
    # Spaces are part of the key (no Bearer token can carry them at its ends, so such a key never matches).
    spaced = with_file(tmp_path, f" {FILE_KEY} \n".encode())
    assert call(spaced, "/tokenize", f"Bearer {FILE_KEY}")[0] == 401
    assert auth.configured_keys(spaced) == [f" {FILE_KEY} ".encode()]


def test_the_previous_key_is_read_from_its_file_too(tmp_path):
    environ = with_file(tmp_path, b"new-key\n", VLLM_SERVICE_PREVIOUS_API_KEY_FILE=key_file(tmp_path, b"old-key", "p"))
    assert call(environ, "/tokenize", "Bearer new-key")[0] == 200
    assert call(environ, "/tokenize", "Bearer old-key")[0] == 200
    assert call(environ, "/tokenize", "Bearer other")[0] == 401
    # And a file beside an environment key.
    mixed = dict(KEYS, VLLM_SERVICE_PREVIOUS_API_KEY_FILE=key_file(tmp_path, b"old-key\n", "q"))
    assert call(mixed, "/tokenize", "Bearer new-key")[0] == 200
    assert call(mixed, "/tokenize", "Bearer old-key")[0] == 200


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "is empty"),
        (b"\n", "is empty"),
        (f"{FILE_KEY}\r\n".encode(), "holds a NUL, carriage return or newline"),
        (f"{FILE_KEY}\n\n".encode(), "holds a NUL, carriage return or newline"),
        (f"{FILE_KEY[:8]}\n{FILE_KEY[8:]}".encode(), "holds a NUL, carriage return or newline"),
        (f"{FILE_KEY}\0".encode(), "holds a NUL, carriage return or newline"),
    ],
    ids=["empty", "only-a-newline", "crlf", "two-newlines", "newline-inside", "nul"],
)
def test_an_unusable_key_file_fails_closed(tmp_path, caplog, content, said):
    environ = with_file(tmp_path, content)
    with caplog.at_level("DEBUG"):
        refuses_every_key(environ, FILE_KEY, FILE_KEY[:8], FILE_KEY[8:], "")
    assert f"unusable API key: VLLM_SERVICE_API_KEY_FILE: '{tmp_path}/VLLM_SERVICE_API_KEY' {said}" in caplog.text
    assert FILE_KEY[:8] not in caplog.text and FILE_KEY[8:] not in caplog.text


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("missing", "No such file or directory"),
        ("a-directory", "Is a directory"),
        ("under-a-file", "Not a directory"),
        ("unreadable", "Permission denied"),
    ],
)
def test_a_key_file_it_cannot_read_fails_closed(tmp_path, caplog, monkeypatch, kind, said):
    path = tmp_path / "VLLM_SERVICE_API_KEY"
    if kind == "a-directory":
        path.mkdir()
    elif kind == "under-a-file":
        path.write_bytes(FILE_KEY.encode())
        path = path / "key"
    elif kind == "unreadable":
        path.write_bytes(FILE_KEY.encode())
        path.chmod(0)
        if os.access(path, os.R_OK):
            # root reads a file of mode 0: what the container's user (the key's uid, mode 0400) would get otherwise.
            def denied(*_args, **_kwargs):
                raise PermissionError(13, "Permission denied", str(path))

            monkeypatch.setattr(auth, "open", denied, raising=False)
    environ = dict(NO_KEY, VLLM_SERVICE_API_KEY_FILE=str(path))
    with caplog.at_level("DEBUG"):
        refuses_every_key(environ, FILE_KEY)
    assert f"unusable API key: VLLM_SERVICE_API_KEY_FILE: cannot read '{path}': {said}" in caplog.text
    assert FILE_KEY not in caplog.text


def test_an_empty_file_variable_is_a_missing_file():
    environ = dict(NO_KEY, VLLM_SERVICE_API_KEY_FILE="")
    refuses_every_key(environ, FILE_KEY)
    with pytest.raises(auth.KeyConfigError, match="VLLM_SERVICE_API_KEY_FILE: cannot read ''"):
        auth.configured_keys(environ)


@pytest.mark.parametrize("value", [FILE_KEY, ""], ids=["key", "empty"])
def test_a_key_and_its_file_both_set_fail_closed(tmp_path, caplog, value):
    environ = with_file(tmp_path, FILE_KEY.encode(), VLLM_SERVICE_API_KEY=value)
    with caplog.at_level("DEBUG"):
        refuses_every_key(environ, FILE_KEY)
    assert "both VLLM_SERVICE_API_KEY and VLLM_SERVICE_API_KEY_FILE are set (set only one)" in caplog.text
    assert FILE_KEY not in caplog.text


def test_an_unusable_previous_key_file_refuses_the_current_key_too(tmp_path, caplog):
    # Half a configuration is no configuration: the operator sees it in the log and at the smoke test.
    environ = dict(KEYS, VLLM_SERVICE_PREVIOUS_API_KEY_FILE=str(tmp_path / "gone"))
    with caplog.at_level("ERROR"):
        refuses_every_key(environ, "new-key")
    assert "VLLM_SERVICE_PREVIOUS_API_KEY_FILE: cannot read" in caplog.text and "new-key" not in caplog.text


def test_every_unusable_key_is_named_at_once(tmp_path):
    environ = dict(
        NO_KEY,
        VLLM_SERVICE_API_KEY="k",
        VLLM_SERVICE_API_KEY_FILE=key_file(tmp_path, b"k"),
        VLLM_SERVICE_PREVIOUS_API_KEY_FILE=key_file(tmp_path, b"", "p"),
    )
    with pytest.raises(auth.KeyConfigError) as raised:
        auth.configured_keys(environ)
    assert str(raised.value) == (
        f"both VLLM_SERVICE_API_KEY and VLLM_SERVICE_API_KEY_FILE are set (set only one);"
        f" VLLM_SERVICE_PREVIOUS_API_KEY_FILE: '{tmp_path}/p' is empty"
    )


def test_an_unusable_key_file_is_no_choice_to_serve_without_a_key(tmp_path):
    # VLLM_SERVICE_ALLOW_UNAUTHENTICATED=1 means "no key on purpose"; a configured key that fails is not that.
    refuses_every_key(with_file(tmp_path, b"", VLLM_SERVICE_ALLOW_UNAUTHENTICATED="1"), FILE_KEY)
    refuses_every_key(dict(NO_KEY, VLLM_SERVICE_API_KEY_FILE="/nonexistent", VLLM_SERVICE_ALLOW_UNAUTHENTICATED="1"))


def test_a_file_key_keeps_the_earlier_name_out(tmp_path):
    # Our own variable in its file form is present: VLLM_API_KEY (a rollback's name) is not read, and has no file form.
    environ = with_file(tmp_path, b"new-key", VLLM_API_KEY="vllms-own", VLLM_API_KEY_FILE=key_file(tmp_path, b"x", "v"))
    assert call(environ, "/tokenize", "Bearer new-key")[0] == 200
    assert call(environ, "/tokenize", "Bearer vllms-own")[0] == 401
    assert call(environ, "/tokenize", "Bearer x")[0] == 401
    assert auth.configured_keys({"VLLM_API_KEY_FILE": key_file(tmp_path, b"x", "w")}) == []


def test_a_key_from_a_file_never_reaches_the_log(tmp_path, caplog):
    with caplog.at_level("DEBUG"):
        for content in (FILE_KEY.encode(), f"{FILE_KEY}\n".encode(), f"{FILE_KEY}\r\n".encode()):
            environ = with_file(tmp_path, content)
            for key in (FILE_KEY, "wrong-key", None):
                call(environ, "/tokenize", key and f"Bearer {key}")
        call(with_file(tmp_path, FILE_KEY.encode(), VLLM_SERVICE_API_KEY=FILE_KEY), "/tokenize", f"Bearer {FILE_KEY}")
    assert caplog.records and FILE_KEY not in caplog.text
