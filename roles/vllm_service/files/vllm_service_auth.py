"""ASGI middleware that requires the API key on every route of vLLM's server.

vLLM checks ``--api-key`` only under a few path prefixes (``/v1``, ...): routes
such as ``/invocations``, ``/tokenize`` and ``/detokenize`` generate or tokenize
without it. Loaded with ``--middleware vllm_service_auth.RequireApiKey``, this
refuses every HTTP request and websocket without ``Authorization: Bearer <key>``
except on the exact paths in ``VLLM_SERVICE_OPEN_PATHS`` (separated by
spaces, e.g. ``/health /metrics``). The keys are ``VLLM_SERVICE_API_KEY`` and,
during a rotation, ``VLLM_SERVICE_PREVIOUS_API_KEY``; both come from the
instance's secrets file. vLLM knows neither name, so it never logs them
(releases before 0.29 print ``--api-key`` and ``--config`` values in their
"non-default args" line) and never writes them into its compile cache (0.13 to
0.28 record ``VLLM_API_KEY`` verbatim there); this middleware is the only check.
``VLLM_API_KEY`` is read only when ``VLLM_SERVICE_API_KEY`` is absent: a
rollback may restore a secrets file written by an earlier version of the role.
With no key it fails closed: every route but the open paths answers 401, unless
``VLLM_SERVICE_ALLOW_UNAUTHENTICATED=1`` says to serve without a key on purpose
(the role writes it only for ``vllm_service_allow_unauthenticated: true`` and
an empty key). Pure ASGI, standard library only, so it works with every vLLM
release's Starlette/FastAPI.

In a container on podman before 5.3 (whose ``podman inspect`` shows an
environment secret's value) a key is a file instead: ``NAME_FILE`` names it
(``/run/secrets/NAME``) for ``NAME`` in ``KEY_VARIABLES``; ``VLLM_API_KEY`` has
no file form (no earlier secrets file had one). The file is read once, at
start, as bytes: exactly one trailing newline (LF) is dropped (``echo key |
podman secret create`` adds it; podman_secrets.py writes the key byte for byte),
nothing else (no CR, no spaces, no second newline). A set variable counts
even when empty. A key that is configured and unusable - ``NAME`` and
``NAME_FILE`` both set, a file missing, unreadable or empty, a NUL, CR or LF
left in it - fails closed like no key at all, even with
``VLLM_SERVICE_ALLOW_UNAUTHENTICATED=1``, and every other key is refused too;
the log names the variables and files, never a key.
"""

import hmac
import json
import logging
import os

KEY_VARIABLES = ("VLLM_SERVICE_API_KEY", "VLLM_SERVICE_PREVIOUS_API_KEY")
# The name secrets files had before vLLM was kept from seeing the key; only a rollback to one of them sets it.
EARLIER_KEY_VARIABLE = "VLLM_API_KEY"
OPEN_PATHS_VARIABLE = "VLLM_SERVICE_OPEN_PATHS"
ALLOW_UNAUTHENTICATED_VARIABLE = "VLLM_SERVICE_ALLOW_UNAUTHENTICATED"
UNAUTHORIZED = json.dumps({"error": "Unauthorized"}).encode()
# NAME_FILE names a file holding NAME's key (podman < 5.3 mounts the key as /run/secrets/NAME).
FILE_SUFFIX = "_FILE"
# What no key can hold: a header value cannot carry them, so such a key could never match.
FORBIDDEN_IN_KEY = (b"\0", b"\r", b"\n")


class KeyConfigError(ValueError):
    """A key is configured and unusable; the message names variables and files, never a key."""


def key_from_file(pointer, path):
    """The key in the file ``path`` (the value of the variable ``pointer``), as bytes; raises KeyConfigError."""
    try:
        with open(path, "rb") as handle:
            key = handle.read()
    except OSError as err:
        raise KeyConfigError(f"{pointer}: cannot read {path!r}: {err.strerror or type(err).__name__}") from None
    # Only the one newline echo adds; anything more (a CR before it, a second one) is refused below, not guessed.
    key = key[:-1] if key.endswith(b"\n") else key
    if not key:
        raise KeyConfigError(f"{pointer}: {path!r} is empty")
    if any(byte in key for byte in FORBIDDEN_IN_KEY):
        raise KeyConfigError(f"{pointer}: {path!r} holds a NUL, carriage return or newline in the key")
    return key


def configured_keys(environ):
    """The accepted keys, as bytes; empty when none is configured. Raises KeyConfigError naming every key that is
    configured and unusable (``NAME`` with ``NAME_FILE``, a file it cannot use)."""
    first = KEY_VARIABLES[0]
    current = first in environ or first + FILE_SUFFIX in environ
    names = KEY_VARIABLES if current else (EARLIER_KEY_VARIABLE, *KEY_VARIABLES[1:])
    keys, problems = [], []
    for name in names:
        pointer = name + FILE_SUFFIX
        if name not in KEY_VARIABLES or pointer not in environ:
            if environ.get(name):
                keys.append(environ[name].encode())
        elif name in environ:
            # Which one the operator meant is a guess: refuse both rather than serve the wrong key.
            problems.append(f"both {name} and {pointer} are set (set only one)")
        else:
            try:
                keys.append(key_from_file(pointer, environ[pointer]))
            except KeyConfigError as err:
                problems.append(str(err))
    if problems:
        raise KeyConfigError("; ".join(problems))
    return keys


def configured_open_paths(environ):
    paths = environ.get(OPEN_PATHS_VARIABLE, "").split()
    if not all(path.startswith("/") for path in paths):
        raise ValueError(f"{OPEN_PATHS_VARIABLE}: every path must start with '/': {paths!r}")
    return frozenset(paths)


def bearer_token(headers):
    """The token of the first ``Authorization: Bearer`` header, or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _sep, token = value.partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


def is_authorized(token, keys):
    # Compare with every key in constant time, so timing says nothing about which one nearly matched.
    matches = [hmac.compare_digest(token or b"", key) for key in keys]
    return token is not None and any(matches)


class RequireApiKey:
    """Refuses requests without a valid key on every path outside the open ones."""

    def __init__(self, app, environ=None):
        environ = os.environ if environ is None else environ
        self.app = app
        try:
            self.keys, unusable = configured_keys(environ), None
        except KeyConfigError as err:
            # A key that is configured and unusable refuses like a missing one; no other key is trusted either.
            self.keys, unusable = [], err
        self.open_paths = configured_open_paths(environ)
        # Only an explicit choice serves without a key; a key that went missing or is unusable refuses instead.
        self.unauthenticated = not self.keys and unusable is None and environ.get(ALLOW_UNAUTHENTICATED_VARIABLE) == "1"
        if unusable is not None:
            logging.getLogger(__name__).error(
                "unusable API key: %s: every route but %s answers 401", unusable, sorted(self.open_paths)
            )
        elif not self.keys and not self.unauthenticated:
            logging.getLogger(__name__).error(
                "no API key (%s): every route but %s answers 401", " or ".join(KEY_VARIABLES), sorted(self.open_paths)
            )

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] not in ("http", "websocket")
            or self.unauthenticated
            or scope.get("path") in self.open_paths
            or is_authorized(bearer_token(scope.get("headers", [])), self.keys)
        ):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            # Policy violation, before the handshake is accepted.
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(UNAUTHORIZED)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": UNAUTHORIZED})
