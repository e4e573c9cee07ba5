"""Process and response hardening: security headers on every HTTP reply, and a home directory
private to the service's user.

**Headers.** The web page loads its module scripts and styles from `/static/` only (no inline
script or style), so its Content-Security-Policy allows scripts from the origin alone; page
images arrive as `blob:` URLs (fetched with the bearer token). `frame-ancestors 'none'` and
`X-Frame-Options: DENY` keep the page out of frames (its two-click Delete could otherwise be
clickjacked); `nosniff` stops a browser from reading a JSON or PNG reply as HTML. The bundled
Swagger UI and ReDoc pages (`/docs`, `/redoc`) start with an inline script: they alone get
`'unsafe-inline'` for scripts and styles, still with no other origin and no framing.

**Home.** Uploads, page images, page KV, the index and the metadata store are tenants' data:
the process creates everything with umask 077 (directories 0700, files 0600), and the home
directory itself, if it already existed wider, is narrowed to 0700 (which closes everything
under it).
"""

from __future__ import annotations

import logging
import os
import stat
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
