"""What one client connection may hold of `conduit serve`: time, header bytes, a place.

Uvicorn bounds an idle keep-alive connection (`timeout_keep_alive`), but not a connection
that opens and then sends its request slowly or never: one that trickles a header byte now
and then, or a body that never ends, holds a file descriptor and a protocol object for as
long as it likes, and enough of them exhaust the process's descriptors (at which point
`/healthz` stops answering too). `conduit serve` therefore runs uvicorn with its own HTTP
protocol, uvicorn's httptools protocol plus four bounds (`ConnectionLimits`):

- **header deadline**: a request's line and headers must have arrived within
  `header_timeout_s` of the connection opening or of its previous response (however the
  bytes trickle); else the connection is closed without a reply (one sweep of the waiting
  connections, oldest first, every quarter of the timeout or second, finds it);
- **header size**: more than `max_header_bytes` before the headers end gets 431 and a close;
- **one reply a request**: when the app answers before a request's body is in (a 400 for too
  many form fields, a 401, a 413), the rest of the body is read and dropped under the body
  deadline, and only then does the next request's header deadline start; a body that may be
  longer than `DISCARD_BYTES` (declared so, or chunked) is not read: that early reply says
  `connection: close` and the connection closes after it. Either way the client never gets a
  second, unrequested reply (before: the body's bytes were parsed as the next headers: 431);
- **body deadline**: a request body must be complete `body_timeout_s` after its headers
  plus a second for every `body_min_rate` bytes received (so a body that trickles or stops
  is cut, and one that averages the rate never is; time the app itself has paused reading
  is not counted); past it the request gets 408 (when nothing was answered yet) and the
  connection is closed, so the app sees the client leave;
- **connection cap**: at most `max_connections` open connections. One more closes the
  oldest connection still waiting for its request's headers (a half-open or idle one), or
  itself when every open one is inside a request, so a flood of half-open connections cannot
  keep a real client (or a probe) out. `fit_open_files` raises the process's open-file limit
  to hold the cap and a reserve for the stores, readers and model files.

WebSocket upgrades are off (the API has none). A reverse proxy in front should still
buffer request bodies and bound its own header and body times and connections per client
(docs/RELIABILITY.md, "Threat model").
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import resource
import time
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from worker.settings import Settings

log = logging.getLogger(__name__)

# descriptors kept beside the connections: stores, index files, readers' pipes, model files
FD_RESERVE = 512
_WARN_EVERY_S = 60
_SWEEP_S = 1.0  # how often overdue headers are looked for (at most; a quarter of the timeout)
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
DISCARD_BYTES = 1 << 20  # body bytes read and dropped after an early reply; more: close


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of every client connection (see the module docstring)."""

    header_timeout_s: float = 15.0
    body_timeout_s: float = 60.0
    body_min_rate: int = 1024
    max_header_bytes: int = 65536
    max_connections: int = 1024

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        """The limits the `http_*` settings name."""
        return cls(header_timeout_s=settings.service.http_header_timeout_s,
                   body_timeout_s=settings.service.http_body_timeout_s,
                   body_min_rate=settings.service.http_body_min_rate,
                   max_header_bytes=settings.service.http_max_header_bytes,
                   max_connections=settings.service.http_max_connections)


class BoundedProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol with the deadlines, the header size and the cap; use a
    subclass from `bounded_protocol`, which holds its server's limits and waiting list."""

    limits: ClassVar[ConnectionLimits]
    # connections waiting for a request's headers -> their deadline (loop time); a dict
    # keeps them in the order they began to wait, which is their deadlines' order
    waiting: ClassVar[dict[BoundedProtocol, float]]
    sweeper: ClassVar[asyncio.TimerHandle | None] = None  # the next look for overdue headers
    warned_at: ClassVar[float] = -_WARN_EVERY_S  # the last warning about the cap

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._body_timer: asyncio.TimerHandle | None = None
        self._awaiting_body = False
        self._header_bytes = 0
        self._body_start = 0.0  # loop time the body deadline counts from
        self._body_bytes = 0
        self._keep_alive = True  # the request's own keep-alive, once its body is in

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the header deadline; past the cap, close the oldest waiting connection."""
        super().connection_made(transport)
        self._await_request()
        if len(self.connections) > self.limits.max_connections:
            next(iter(self.waiting))._close()  # this one, when no other waits
            now = time.monotonic()
            if now - type(self).warned_at >= _WARN_EVERY_S:
                type(self).warned_at = now
                log.warning("%d connections open, past the cap of %d: closing the oldest that "
                            "sent no request (again without a warning for %d s)",
                            len(self.connections), self.limits.max_connections, _WARN_EVERY_S)

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection and its deadlines."""
        self.waiting.pop(self, None)
        self._cancel_body_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Parse; bytes that leave the headers still unfinished count towards their cap, and
        a body still to come gets its deadline."""
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self in self.waiting:
            self._header_bytes += len(data)
            if self._header_bytes > self.limits.max_header_bytes:
                self._refuse(431, f"the request's headers exceed "
                                  f"{self.limits.max_header_bytes} bytes")
        elif self._awaiting_body and self._body_timer is None:
            self._arm_body()

    def on_headers_complete(self) -> None:
        """Headers in: the request runs; its body (if any) has its own deadline."""
        self.waiting.pop(self, None)
        self._header_bytes = 0
        super().on_headers_complete()
        self._awaiting_body = True
        self._body_start, self._body_bytes = self.loop.time(), 0
        if self.cycle is not None:  # a reply before a long body is in closes the connection
            self._keep_alive = self.cycle.keep_alive
            if not self._body_discardable():
                self.cycle.keep_alive = False

    def _body_discardable(self) -> bool:
        """Whether the body is declared and at most `DISCARD_BYTES` (else it is not read after
        an early reply)."""
        lengths = [v for k, v in self.headers if k == b"content-length"]
        chunked = any(k == b"transfer-encoding" for k, _ in self.headers)
        return not chunked and len(lengths) <= 1 and all(
            v.strip().isdigit() and int(v) <= DISCARD_BYTES for v in lengths)

    def on_body(self, body: bytes) -> None:
        """Body bytes: the body deadline moves on by their share of the minimum rate."""
        super().on_body(body)
        self._body_bytes += len(body)

    def on_message_complete(self) -> None:
        """The whole body is in: no deadline until the response ends; the request keeps its
        keep-alive unless its reply started first; already answered, the next may come."""
        super().on_message_complete()
        self._awaiting_body = False
        self._cancel_body_timer()
        cycle = self.cycle
        if cycle is None or self.transport.is_closing():
            return
        if not cycle.response_started:
            cycle.keep_alive = self._keep_alive
        elif cycle.response_complete:  # the rest of an early-refused body is dropped
            self._await_request()

    def on_response_complete(self) -> None:
        """Kept alive with no request parsed ahead and its body all in: wait for the next
        one's headers (a body still arriving is dropped first, under its deadline)."""
        super().on_response_complete()
        if not self.transport.is_closing() and not self._awaiting_body and (
                self.cycle is None or self.cycle.response_complete):
            self._await_request()

    def _await_request(self) -> None:
        self.waiting.pop(self, None)
        self.waiting[self] = self.loop.time() + self.limits.header_timeout_s  # the newest
        self._header_bytes = 0
        if type(self).sweeper is None:
            self._schedule_sweep(self.loop)

    @classmethod
    def _schedule_sweep(cls, loop: asyncio.AbstractEventLoop) -> None:
        every = min(_SWEEP_S, cls.limits.header_timeout_s / 4)
        cls.sweeper = loop.call_later(every, cls._sweep, loop)

    @classmethod
    def _sweep(cls, loop: asyncio.AbstractEventLoop) -> None:
        """Close every connection whose headers are overdue (the oldest come first)."""
        cls.sweeper = None
        now = loop.time()
        while cls.waiting:
            oldest, due = next(iter(cls.waiting.items()))
            if due > now:
                break
            oldest._close()
        if cls.waiting:
            cls._schedule_sweep(loop)

    def _body_overdue(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if not self._awaiting_body or cycle is None:
            return
        if self.flow.read_paused and not cycle.response_complete:  # the app has not taken
            # what came: not the client's delay
            self._body_start = self.loop.time() - self._body_bytes / self.limits.body_min_rate
        if self._body_due() > self.loop.time():  # bytes came since it was armed
            self._arm_body()
        elif cycle.response_started:
            self._close()
        else:
            self._refuse(408, "the request body did not arrive in time (CONDUIT_HTTP_BODY_"
                              "TIMEOUT_S, CONDUIT_HTTP_BODY_MIN_RATE)")

    def _body_due(self) -> float:
        return self._body_start + self.limits.body_timeout_s + \
            self._body_bytes / self.limits.body_min_rate

    def _arm_body(self) -> None:
        self._cancel_body_timer()
        self._body_timer = self.loop.call_later(max(0.0, self._body_due() - self.loop.time()),
                                                self._body_overdue)

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _refuse(self, status: int, detail: str) -> None:
        """Answer `status` with a JSON detail and close (nothing else will be answered)."""
        body = json.dumps({"detail": detail}).encode()
        if self.cycle is not None:  # the app sees the client leave; its reply is dropped
            self.cycle.keep_alive = False
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                             % (status, _REASONS[status], len(body), body))
        self._close()

    def _close(self) -> None:
        self.waiting.pop(self, None)
        self._cancel_body_timer()
        if not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(limits: ConnectionLimits) -> type[BoundedProtocol]:
    """A protocol class for one server: `limits`, and its own list of waiting connections."""
    class BoundedHttpProtocol(BoundedProtocol):
        pass

    BoundedHttpProtocol.limits = limits
    BoundedHttpProtocol.waiting = {}
    BoundedHttpProtocol.sweeper = None
    return BoundedHttpProtocol


def fit_open_files(max_connections: int) -> int:
    """Raise this process's open-file limit to hold `max_connections` and `FD_RESERVE`
    (up to the hard limit); return the connection cap that fits, lowered with a warning
    when the limit cannot be raised far enough."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as exc:
            log.warning("could not raise the open-file limit to %d: %s", target, exc)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return max_connections
    fitted = max(8, min(max_connections, soft - FD_RESERVE, soft // 2))
    log.warning("the open-file limit is %d: at most %d connections (CONDUIT_HTTP_MAX_"
                "CONNECTIONS is %d)", soft, fitted, max_connections)
    return fitted


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of `uvicorn.run` that bound every connection as the settings say."""
    limits = ConnectionLimits.from_settings(settings)
    cap = fit_open_files(limits.max_connections)
    limits = dataclasses.replace(limits, max_connections=cap)
    return {"http": bounded_protocol(limits), "ws": "none",
            "timeout_keep_alive": settings.service.http_keep_alive_s,
            "h11_max_incomplete_event_size": settings.service.http_max_header_bytes}
