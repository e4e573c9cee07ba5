"""ASGI middleware that refuses a request before any byte of its body is read: a missing or
wrong API key (401), a declared or streamed body over the limit (413).

Without it, Starlette spools multipart file parts to the temp directory before the endpoint
(and its auth dependency) runs: an unauthenticated 300 MiB POST wrote 283 MiB to disk before
its 401. Only the probes (`/healthz`, `/readyz`: it says nothing but "ready") and the web
page's static files are open when keys are configured;
`/metrics` takes the operator's metrics key only (its counters span all tenants). The body
limit is enforced twice: on `Content-Length` up front, and by counting the bytes actually
received (chunked bodies, lying headers): past the limit the middleware answers 413 itself
and tells the app that the client left.
"""

from __future__ import annotations

import json
import re

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth import KeyRing, bearer_token
from storage.text_safety import safe_value

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/"})  # probes, and the web page's shell
OPEN_PREFIXES = ("/static/",)  # its scripts and styles: no data behind them
UPLOAD_PATH = re.compile(r"^/v1/collections/[^/]+/documents/?$")
FORM_OVERHEAD = 1 << 20  # multipart boundaries and the password field, beside the file
JSON_LIMIT = 1 << 20  # every other body is a small JSON document


async def _reply(send: Send, status: int, detail: str,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    """Authenticates and bounds the body of every HTTP request before the app reads it."""

    def __init__(self, app: ASGIApp, *, keyring: KeyRing, max_upload_bytes: int) -> None:
        self.app = app
        self.keyring = keyring
        self.max_upload = max_upload_bytes + FORM_OVERHEAD

    def limit(self, path: str) -> int:
        """Largest body accepted on `path`."""
        return self.max_upload if UPLOAD_PATH.match(path) else JSON_LIMIT

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse early, or pass the request on with a counting `receive`."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        headers = {k.lower(): v for k, v in scope["headers"]}
        refusal = self._check_key(path, headers.get(b"authorization"))
        if refusal is not None:
            status, detail = refusal
            await _reply(send, status, detail, [(b"www-authenticate", b"Bearer")])
            return
        limit = self.limit(path)
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > limit
            except ValueError:
                await _reply(send, 400, "invalid Content-Length header")
                return
            if too_big:
                await _reply(send, 413, f"the request body exceeds the limit of {limit} bytes")
                return
        await self._bounded(scope, receive, send, limit)

    def _check_key(self, path: str, header: bytes | None) -> tuple[int, str] | None:
        if not self.keyring.enabled or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            return None
        token = bearer_token(header.decode("latin-1") if header else None)
        if token is None:
            return 401, "missing bearer token"
        if path == "/metrics":
            if self.keyring.is_metrics_key(token):
                return None
            return 403, ("/metrics needs the operator's metrics key (CONDUIT_METRICS_KEY): "
                         "its counters cover every tenant")
        if self.keyring.tenant(token) is None:
            return 401, "invalid API key"
        return None

    async def _bounded(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        received = 0
        refused = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    if not started:
                        await _reply(send, 413,
                                     f"the request body exceeds the limit of {limit} bytes")
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 went out; the app's own reply is dropped
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not refused:
                raise  # a refused body's parse error is expected: the 413 already went out


async def validation_error(_: Request, exc: Exception) -> JSONResponse:
    """422 for a body that fails validation. FastAPI's own handler echoes the offending input,
    and a NaN or Infinity there (Python's JSON parser accepts them) made the error reply itself
    fail to encode: a 500. Inputs that JSON cannot carry are left out, and lone surrogates
    (`"\\udcc6"` in a JSON string: the reply could not be encoded either) are escaped."""
    assert isinstance(exc, RequestValidationError)
    errors = safe_value(jsonable_encoder(exc.errors()))
    try:
        json.dumps(errors, allow_nan=False)
    except ValueError:
        errors = [{k: v for k, v in e.items() if k not in ("input", "ctx")} for e in errors]
    return JSONResponse({"detail": errors}, status_code=422)
