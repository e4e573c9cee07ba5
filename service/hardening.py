"""Process and response hardening: security headers on every HTTP reply, loopback Host names
only in the open mode, a loopback bind unless told otherwise, and a home directory private to
the service's user.

**Headers.** The web page loads its module scripts and styles from `/static/` only (no inline
script or style), so its Content-Security-Policy allows scripts from the origin alone; page
images arrive as `blob:` URLs (fetched with the bearer token). `frame-ancestors 'none'` and
`X-Frame-Options: DENY` keep the page out of frames (its two-click Delete could otherwise be
clickjacked); `nosniff` stops a browser from reading a JSON or PNG reply as HTML. The bundled
Swagger UI and ReDoc pages (`/docs`, `/redoc`) start with an inline script: they alone get
`'unsafe-inline'` for scripts and styles, still with no other origin and no framing.

**Open mode.** With no API keys every caller is the one tenant `default`, which is safe on a
loopback address only. A browser page from anywhere can still reach a loopback server by DNS
rebinding (its name first resolves to the attacker, then to 127.0.0.1, and the page reads the
answers as same-origin), but its requests carry the attacker's name in `Host`. So without
keys only loopback Host names are answered (`localhost`, `*.localhost`, `127.0.0.0/8`,
`[::1]`, any port) and the names of `allowed_hosts` ("*": any); any other gets 403 with a JSON
body saying how to configure keys. The probes `/healthz` and `/readyz` say nothing and
answer any Host. With keys every Host is answered: a rebinding page holds no key.
`conduit serve` refuses a non-loopback bind address without keys unless
`allow_open_network` (`--allow-open`) says so, and then warns (`check_bind`).

**Home.** Uploads, page images, page KV, the index and the metadata store are tenants' data:
the process creates everything with umask 077 (directories 0700, files 0600), and the home
directory itself, if it already existed wider, is narrowed to 0700 (which closes everything
under it).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import stat
from collections.abc import Sequence
from pathlib import Path

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

PAGE_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
            "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
            "form-action 'self'; frame-ancestors 'none'")
DOCS_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; "
            "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
            "worker-src 'self' blob:; object-src 'none'; base-uri 'none'; form-action 'self'; "
            "frame-ancestors 'none'")
DOCS_PATHS = frozenset({"/docs", "/redoc", "/docs/oauth2-redirect"})
COMMON_HEADERS = (
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=(), payment=()"),
)
PRIVATE_UMASK = 0o077
PROBE_PATHS = frozenset({"/healthz", "/readyz"})
HOST_REFUSAL = ("this server has no API keys, so it answers only loopback Host names "
                "(localhost, 127.0.0.1, [::1]); to serve it under another name configure "
                "CONDUIT_API_KEYS or CONDUIT_API_KEYS_FILE (or name the host in "
                "CONDUIT_ALLOWED_HOSTS, for a proxy that authenticates)")


class SecurityHeadersMiddleware:
    """Adds the security headers to every HTTP response (refusals of the guard included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to its response start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = (DOCS_CSP if scope["path"] in DOCS_PATHS else PAGE_CSP).encode()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in ((b"content-security-policy", csp), *COMMON_HEADERS)
                         if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def private_home(home: Path) -> None:
    """Make this process create files private to its user (umask 077), create `home` as 0700,
    and narrow an existing home that other users could enter or read to 0700."""
    os.umask(PRIVATE_UMASK)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = stat.S_IMODE(home.stat().st_mode)
    if mode & 0o077:
        try:
            home.chmod(0o700)
        except OSError as exc:  # not the owner (a mounted volume's root): say so, go on
            log.warning("could not make the home %s private (mode %o): %s", home, mode, exc)


def host_name(header: str) -> str:
    """The name of a `Host` header value: lower case, without port, brackets or a final dot."""
    value = header.strip().lower()
    if value.startswith("["):  # [v6] or [v6]:port
        return value[1:value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def is_loopback_name(name: str) -> bool:
    """Whether a host name (as `host_name` gives it) can only mean this machine."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class LoopbackHostMiddleware:
    """The open mode's guard against DNS rebinding (see the module docstring): answers 403
    to a request whose Host is neither a loopback name nor one of `allowed`."""

    def __init__(self, app: ASGIApp, *, allowed: Sequence[str] = ()) -> None:
        self.app = app
        self.any_host = "*" in allowed
        self.allowed = frozenset(host_name(h) for h in allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass an allowed request on; refuse the others before their body is read."""
        if scope["type"] != "http" or self.any_host or scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k.lower() == b"host"), b"")
        name = host_name(header.decode("latin-1"))
        if is_loopback_name(name) or name in self.allowed:
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": HOST_REFUSAL}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def is_loopback_address(host: str) -> bool:
    """Whether binding `host` listens on loopback interfaces only (a name counts when every
    address it resolves to is a loopback one)."""
    name = host_name(host) if host.startswith("[") else host.strip().lower().rstrip(".")
    if is_loopback_name(name) and not name.endswith(".localhost"):
        return True
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).partition("%")[0])
                               .is_loopback for info in infos)


def check_bind(host: str, *, keys: bool, allow_open: bool) -> str | None:
    """Why `conduit serve` must not bind `host`, or None when it may: a non-loopback address
    with no API keys is refused unless `allow_open` (then it warns)."""
    if keys or is_loopback_address(host):
        return None
    if allow_open:
        log.warning("serving %s with no API keys (CONDUIT_ALLOW_OPEN_NETWORK): every caller "
                    "is the one tenant; only loopback Host names and CONDUIT_ALLOWED_HOSTS are "
                    "answered", host)
        return None
    return (f"refusing to serve {host} with no API keys: anyone who can reach it could read and "
            "delete every document. Configure CONDUIT_API_KEYS or CONDUIT_API_KEYS_FILE, bind "
            "127.0.0.1, or pass --allow-open (CONDUIT_ALLOW_OPEN_NETWORK=1) for a network you "
            "trust (still only loopback Host names are answered without keys).")
