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


def configured_keys(environ):
    """The accepted keys, as bytes; empty when none is configured."""
    names = KEY_VARIABLES if KEY_VARIABLES[0] in environ else (EARLIER_KEY_VARIABLE, *KEY_VARIABLES[1:])
    return [environ[name].encode() for name in names if environ.get(name)]


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
        self.keys = configured_keys(environ)
        self.open_paths = configured_open_paths(environ)
        # Only an explicit choice serves without a key; a key that went missing refuses instead.
        self.unauthenticated = not self.keys and environ.get(ALLOW_UNAUTHENTICATED_VARIABLE) == "1"
        if not self.keys and not self.unauthenticated:
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
