"""Hostile requests on loopback (findings 1, 5, 10, 11): each is refused with a clear 4xx
before it costs anything, and the service keeps answering."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from tests.faults.conftest import start_serve

KEYS = {"acme-old": "acme", "acme-new": "acme", "globex-key": "globex"}
MIB = 1 << 20


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    home = tmp_path_factory.mktemp("hostile")
    (home / "tmp").mkdir()
    keys = home / "keys.json"
    keys.write_text(json.dumps(KEYS))
    url, proc = start_serve(home, {"CONDUIT_API_KEYS_FILE": str(keys),
                                   "CONDUIT_API_KEYS": json.dumps(["legacy-key"]),
                                   "CONDUIT_METRICS_KEY": "ops-secret", "TMPDIR":
                                   str(home / "tmp"), "CONDUIT_OCR": "false"})
    yield url, home
    proc.terminate()
    proc.wait(timeout=30)


def _client(url: str, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url, timeout=120, headers=headers)


FILE_PART = (b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.pdf"\r\n'
             b"Content-Type: application/pdf\r\n\r\n%PDF-1.7\n")


def _raw_post(url: str, path: str, headers: dict[str, str], body_bytes: int,
              chunked: bool = False) -> tuple[int, str, int]:
    """POST `body_bytes` over a raw socket (a multipart file part: its head, then zeros),
    stopping when the server answers; returns (status, body, bytes sent)."""
    u = urlparse(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=30)
    head = {"Host": "x", **headers}
    if chunked:
        head["Transfer-Encoding"] = "chunked"
    else:
        head["Content-Length"] = str(body_bytes)
    sock.sendall((f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in
                                                         head.items()) + "\r\n").encode())
    sent, reply = 0, b""
    zeros = b"\0" * (256 * 1024)
    while sent < body_bytes and b"\r\n\r\n" not in reply:
        if select.select([sock], [], [], 0)[0]:  # the server answered: stop sending
            reply += sock.recv(65536)
            continue
        piece = FILE_PART + zeros[len(FILE_PART):] if sent == 0 else zeros
        frame = (f"{len(piece):x}\r\n".encode() + piece + b"\r\n") if chunked else piece
        try:
            sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            break
        sent += len(piece)
    try:
        while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    sock.close()
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2].decode(), sent


def _spooled(home: Path) -> int:
    return sum(p.stat().st_size for p in (home / "tmp").rglob("*") if p.is_file())


def test_an_unauthenticated_300_mib_body_is_refused_before_it_is_read(
        service: tuple[str, Path]) -> None:
    url, home = service
    start = time.monotonic()
    status, body, sent = _raw_post(url, "/v1/collections/col_x/documents",
                                   {"Content-Type": "multipart/form-data; boundary=b"},
                                   300 * MIB)
    assert status == 401 and "bearer" in body
    assert time.monotonic() - start < 30
    assert sent < 300 * MIB and _spooled(home) < MIB  # before: 283 MiB spooled, then 401


def test_oversized_bodies_with_a_key_are_413_declared_or_streamed(
        service: tuple[str, Path]) -> None:
    url, home = service
    auth = {"Authorization": "Bearer acme-new",
            "Content-Type": "multipart/form-data; boundary=b"}
    status, body, _ = _raw_post(url, "/v1/collections/col_x/documents", auth, 300 * MIB)
    assert status == 413 and "limit" in body
    status, body, sent = _raw_post(url, "/v1/collections/col_x/documents", auth, 64 * MIB,
                                   chunked=True)  # no Content-Length: counted as it streams
    assert status == 413 and "limit" in body
    assert sent < 64 * MIB and _spooled(home) < 4 * MIB
    status, _, _ = _raw_post(url, "/v1/query", {"Authorization": "Bearer acme-new",
                                                "Content-Type": "application/json"}, 8 * MIB)
    assert status == 413
    assert _client(url).get("/healthz").status_code == 200


def test_every_endpoint_but_the_probes_needs_a_key(service: tuple[str, Path]) -> None:
    url, _ = service
    anon, tenant = _client(url), _client(url, "acme-old")
    for path in ("/docs", "/openapi.json", "/v1/info", "/v1/collections", "/metrics"):
        assert anon.get(path).status_code == 401, path
    assert anon.get("/healthz").status_code == 200
    ready = anon.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}  # no home path
    assert tenant.get("/openapi.json").status_code == 200
    # /metrics counts every tenant's cache traffic: only the operator's key reads it
    refused = tenant.get("/metrics")
    assert refused.status_code == 403 and "CONDUIT_METRICS_KEY" in refused.json()["detail"]
    metrics = _client(url, "ops-secret").get("/metrics")
    assert metrics.status_code == 200 and "conduit_kv_hits" in metrics.text


def test_keys_file_maps_rotated_keys_to_one_tenant(service: tuple[str, Path]) -> None:
    url, _ = service
    old, new, other = _client(url, "acme-old"), _client(url, "acme-new"), \
        _client(url, "globex-key")
    col = old.post("/v1/collections", json={"name": "rotated"}).json()["collection_id"]
    assert new.get(f"/v1/collections/{col}").status_code == 200  # same tenant after rotation
    assert other.get(f"/v1/collections/{col}").status_code == 404
    legacy = _client(url, "legacy-key")  # the list form keeps working
    assert legacy.get(f"/v1/collections/{col}").status_code == 404
    assert legacy.post("/v1/collections", json={"name": "rotated"}).status_code == 201


def test_nan_and_infinity_are_422_not_500(service: tuple[str, Path]) -> None:
    url, _ = service
    client = _client(url, "acme-old")
    col = client.post("/v1/collections", json={"name": "nan"}).json()["collection_id"]
    for field, value in (("budget", "NaN"), ("temperature", "Infinity"), ("gamma", "-Infinity")):
        r = client.post("/v1/query", headers={"Content-Type": "application/json"},
                        content=f'{{"collection_id": "{col}", "question": "q", '
                                f'"{field}": {value}}}')
        assert r.status_code == 422, (field, r.text)
    chat = client.post("/v1/chat/completions", headers={"Content-Type": "application/json"},
                       content=f'{{"model": "conduit:{col}", "temperature": NaN, "messages": '
                               '[{"role": "user", "content": "q"}]}')
    assert chat.status_code == 422, chat.text


def test_a_16k_token_question_is_422_naming_the_limit(service: tuple[str, Path]) -> None:
    url, _ = service
    client = _client(url, "acme-old")
    col = client.post("/v1/collections", json={"name": "long"}).json()["collection_id"]
    question = "why " + "\U0001F600" * 3996  # 4,000 characters, about 16k tokens
    r = client.post("/v1/query", json={"collection_id": col, "question": question})
    assert r.status_code == 422 and "limit is 1024 tokens" in r.json()["detail"], r.text
    chat = client.post("/v1/chat/completions", json={
        "model": f"conduit:{col}", "messages": [{"role": "user", "content": question}]})
    assert chat.status_code == 422 and "1024 tokens" in chat.text
    assert client.get("/healthz").status_code == 200
