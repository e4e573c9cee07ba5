"""An outsider holding connections open cannot exhaust `conduit serve` (issue 60, point 4):
half-open requests (headers or a body trickled, or never finished) are closed after their
deadline, the open connections stay under the cap, and /healthz answers throughout."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from service.connections import DISCARD_BYTES
from tests.service.conftest import start_server, stop_server

CAP, DEADLINE_S = 64, 2.0
LIMITS = {"CONDUIT_MODEL": "builtin:tiny-qwen2-vl", "CONDUIT_OCR": "false",
          "CONDUIT_HTTP_MAX_CONNECTIONS": str(CAP),
          "CONDUIT_HTTP_HEADER_TIMEOUT_S": str(DEADLINE_S),
          "CONDUIT_HTTP_BODY_TIMEOUT_S": str(DEADLINE_S)}
HALF_HEADERS = b"GET /v1/collections HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a"
HALF_BODY = (b"POST /v1/collections HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"name\": ")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of a server with a small connection cap and 2 s deadlines."""
    url, proc = start_server(tmp_path_factory.mktemp("slow-home"), LIMITS)
    yield url, proc.pid
    stop_server(proc)


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _open_sockets(pid: int) -> int:
    """Sockets the process holds (an fd closed while they are listed is not one)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            continue
    return count


def _closed_by_peer(sock: socket.socket) -> bytes | None:
    """What the server sent before closing, or None while the connection is still open."""
    sock.setblocking(False)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except BlockingIOError:
        return None
    except OSError:  # reset
        return data
    return data


def test_half_open_connections_are_closed_and_health_answers(
        server: tuple[str, int]) -> None:
    """300 connections: 280 trickle header bytes, 20 trickle a body. Before: uvicorn kept
    all 300 open for as long as they trickled (its keep-alive timer restarts on each byte),
    the server held 300 more sockets, and at 20,000 such connections /healthz stopped."""
    url, pid = server
    baseline = _open_sockets(pid)
    attackers = []
    for i in range(300):
        sock = socket.create_connection(_address(url), timeout=10)
        sock.sendall(HALF_BODY if i % 15 == 0 else HALF_HEADERS)
        attackers.append(sock)
    most, health, start = 0, [], time.monotonic()
    open_ = set(range(len(attackers)))
    replies: dict[int, bytes] = {}
    while time.monotonic() - start < 4 * DEADLINE_S:
        for i in sorted(open_):
            sent = _closed_by_peer(attackers[i])
            if sent is not None:
                open_.discard(i)
                replies[i] = sent
                continue
            try:
                attackers[i].send(b"a")  # one more byte: never idle, never finished
            except OSError:
                pass
        most = max(most, _open_sockets(pid) - baseline)
        began = time.monotonic()
        health.append((httpx.get(url + "/healthz", timeout=5).status_code,
                       time.monotonic() - began))
        time.sleep(0.2)
    for sock in attackers:
        sock.close()
    assert open_ == set(), f"{len(open_)} half-open connections still open"
    assert most <= CAP + 2, most  # the cap (and the probe's own connection)
    assert all(status == 200 for status, _ in health), health
    assert max(seconds for _, seconds in health) < 5
    for i, sent in replies.items():  # a closed body gets its 408 when its headers were read
        assert sent == b"" or sent.startswith(b"HTTP/1.1 408 "), (i, sent[:80])
    assert any(sent.startswith(b"HTTP/1.1 408 ") for sent in replies.values())


def test_a_stalled_body_gets_408_and_nothing_is_created(server: tuple[str, int]) -> None:
    url, _ = server
    with socket.create_connection(_address(url), timeout=30) as sock:
        sock.sendall(HALF_BODY)
        began = time.monotonic()
        reply = sock.recv(65536)
        waited = time.monotonic() - began
    assert reply.startswith(b"HTTP/1.1 408 ") and b"CONDUIT_HTTP_BODY_TIMEOUT_S" in reply, reply
    assert DEADLINE_S - 0.5 < waited < DEADLINE_S + 10
    assert httpx.get(url + "/v1/collections", timeout=30).json() == []


def test_oversized_headers_get_431(server: tuple[str, int]) -> None:
    url, _ = server
    with socket.create_connection(_address(url), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            for _ in range(100):
                sock.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
        except OSError:  # closed by the server mid-send
            pass
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:100]


def _read_until_quiet(sock: socket.socket, quiet_s: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (True) or stays quiet for `quiet_s`."""
    sock.settimeout(quiet_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    except OSError:  # reset
        return data, True
    return data, True


@pytest.mark.parametrize("padding_bytes", [200_000, 2_000_000])
def test_an_early_refusal_gets_one_reply_on_a_kept_alive_connection(
        server: tuple[str, int], padding_bytes: int) -> None:
    """Issue 70, item 2: 1,001 form fields and 200 KB of padding get one 400; the rest of the
    body is read and dropped, so the next request on the connection gets its own reply
    (before: a stray 431 about the body's bytes counted as the next request's headers). A body
    past `DISCARD_BYTES` gets the 400 with `connection: close` instead."""
    url, _ = server
    boundary = b"b0undary"
    fields = b"".join(b"--%s\r\nContent-Disposition: form-data; name=\"f%d\"\r\n\r\nx\r\n"
                      % (boundary, i) for i in range(1001))
    padding = (b"--%s\r\nContent-Disposition: form-data; name=\"pad\"\r\n\r\n%s\r\n--%s--\r\n"
               % (boundary, b"p" * padding_bytes, boundary))
    body = fields + padding
    head = (b"POST /v1/collections/col_none/documents HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: multipart/form-data; boundary=%s\r\nContent-Length: %d\r\n\r\n"
            % (boundary, len(body)))
    with socket.create_connection(_address(url), timeout=30) as sock:
        sock.sendall(head + body)
        first, closed = _read_until_quiet(sock, DEADLINE_S / 2)  # within the header deadline
        assert first.startswith(b"HTTP/1.1 400 "), first[:200]
        assert first.count(b"HTTP/1.1 ") == 1, first[:400]
        if padding_bytes > DISCARD_BYTES:  # not read: the one reply announces the close
            assert closed and b"connection: close" in first.lower(), first[:400]
            return
        assert not closed and b"connection: close" not in first.lower(), first[:400]
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        second, _ = _read_until_quiet(sock, DEADLINE_S / 2)
    assert second.startswith(b"HTTP/1.1 200 ") and second.count(b"HTTP/1.1 ") == 1, second[:400]
