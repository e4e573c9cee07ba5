"""The open mode (no API keys) is for loopback use: it answers loopback Host names only, so a
web page cannot read the documents by DNS rebinding, and `conduit serve` will not bind a
non-loopback address without keys unless told to (issue 60, point 4)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from service.hardening import check_bind, host_name, is_loopback_name
from tests.service.conftest import free_port, start_server, stop_server

TINY = {"CONDUIT_MODEL": "builtin:tiny-qwen2-vl", "CONDUIT_OCR": "false"}
HOSTILE = ("attacker.example", "attacker.example:{port}", "localhost.attacker.example",
           "127.0.0.1.nip.io:{port}", "0.0.0.0:{port}", "10.0.0.5", "")


def test_host_names_are_read_as_a_browser_sends_them() -> None:
    assert [host_name(h) for h in ("LocalHost:8000", "[::1]:8000", "localhost.", "::1",
                                   "app.localhost")] == \
        ["localhost", "::1", "localhost", "::1", "app.localhost"]
    assert all(is_loopback_name(n) for n in ("localhost", "app.localhost", "127.0.0.1",
                                             "127.8.9.10", "::1"))
    assert not any(is_loopback_name(n) for n in ("localhost.attacker.example", "0.0.0.0",
                                                 "::", "attacker.example", ""))


def test_binding_beyond_loopback_needs_keys_or_the_explicit_flag() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "[::1]"):
        assert check_bind(host, keys=False, allow_open=False) is None
    refusal = check_bind("0.0.0.0", keys=False, allow_open=False)
    assert refusal is not None and "CONDUIT_API_KEYS" in refusal and "--allow-open" in refusal
    assert check_bind("", keys=False, allow_open=False) is not None  # every interface
    assert check_bind("0.0.0.0", keys=True, allow_open=False) is None
    assert check_bind("0.0.0.0", keys=False, allow_open=True) is None


def test_without_keys_only_loopback_hosts_are_answered(tmp_path: Path) -> None:
    """Before: `Host: attacker.example` listed and created collections like localhost."""
    url, proc = start_server(tmp_path, {**TINY, "CONDUIT_ALLOWED_HOSTS": '["docs.internal"]'})
    port = int(url.rsplit(":", 1)[1])
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            assert client.post("/v1/collections", json={"name": "private"}).status_code == 201
            for host in HOSTILE:
                host = host.format(port=port)
                listed = client.get("/v1/collections", headers={"Host": host})
                assert listed.status_code == 403, (host, listed.text)
                assert "CONDUIT_API_KEYS" in listed.json()["detail"]
                assert "private" not in listed.text
                assert listed.headers["x-frame-options"] == "DENY"  # still a hardened reply
                made = client.post("/v1/collections", json={"name": "planted"},
                                   headers={"Host": host})
                assert made.status_code == 403
                assert client.get("/healthz", headers={"Host": host}).status_code == 200
            for host in (f"localhost:{port}", "localhost", f"[::1]:{port}", "LOCALHOST.",
                         f"app.localhost:{port}", f"127.0.0.1:{port}", "docs.internal:443"):
                listed = client.get("/v1/collections", headers={"Host": host})
                assert listed.status_code == 200, (host, listed.text)
                assert [c["name"] for c in listed.json()] == ["private"]  # nothing planted
    finally:
        stop_server(proc)


def test_with_keys_any_host_is_answered(tmp_path: Path) -> None:
    url, proc = start_server(tmp_path, {**TINY, "CONDUIT_API_KEYS": '["alpha-key"]'})
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            key = {"Authorization": "Bearer alpha-key"}
            assert client.get("/v1/collections", headers={**key, "Host": "conduit.example"}
                              ).status_code == 200
            assert client.get("/v1/collections", headers={"Host": "conduit.example"}
                              ).status_code == 401
    finally:
        stop_server(proc)


def _serve(home: Path, *args: str) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", *args],
        env={**os.environ, "CONDUIT_HOME": str(home), "HF_HUB_OFFLINE": "1", **TINY},
        stdout=log, stderr=subprocess.STDOUT)


def _wait_up(proc: subprocess.Popen[bytes], port: int) -> bool:
    """True once /healthz answers on 127.0.0.1:`port`, False if the process ends first."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            time.sleep(0.3)
    raise TimeoutError("the server neither started nor ended")


def test_serve_refuses_a_public_bind_without_keys(tmp_path: Path) -> None:
    """Before: `conduit serve --host 0.0.0.0` with no keys served every interface."""
    port = free_port()
    proc = _serve(tmp_path / "refused", "--host", "0.0.0.0", "--port", str(port))
    try:
        assert _wait_up(proc, port) is False, "it served 0.0.0.0 with no keys"
    finally:
        stop_server(proc)
    assert proc.returncode == 2
    said = (tmp_path / "refused" / "server.log").read_text()
    assert "refusing to serve 0.0.0.0 with no API keys" in said and "--allow-open" in said


def test_serve_binds_a_public_address_when_told_and_warns(tmp_path: Path) -> None:
    port = free_port()
    proc = _serve(tmp_path, "--host", "0.0.0.0", "--port", str(port), "--allow-open")
    try:
        assert _wait_up(proc, port), (tmp_path / "server.log").read_text()
        assert "serving 0.0.0.0 with no API keys" in (tmp_path / "server.log").read_text()
        refused = httpx.get(f"http://127.0.0.1:{port}/v1/collections", timeout=30,
                            headers={"Host": "attacker.example"})
        assert refused.status_code == 403  # still no other Host without keys
    finally:
        stop_server(proc)
