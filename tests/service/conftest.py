"""A real `conduit serve` process on a free loopback port, with its home in a temp dir."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    home: Path, extra_env: dict[str, str] | None = None
) -> tuple[str, subprocess.Popen[bytes]]:
    """Start `conduit serve` and wait until /healthz answers."""
    port = free_port()
    env = {**os.environ, "CONDUIT_HOME": str(home), "HF_HUB_OFFLINE": "1",
           "CONDUIT_MAX_UPLOAD_BYTES": str(2 * 2**20), **(extra_env or {})}
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300  # importing torch alone can take a minute on a busy CI box
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((home / "server.log").read_text())
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return url, proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start:\n" + (home / "server.log").read_text())


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server started by `start_server`: SIGTERM, then SIGKILL after 20 s."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(base URL, home dir) of a running embedded-mode server."""
    home = tmp_path_factory.mktemp("conduit-home")
    url, proc = start_server(home)
    yield url, home
    stop_server(proc)


def wait_ready(client: httpx.Client, document_id: str, timeout: float = 180) -> dict:
    """Poll a document until it is ready or failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = client.get(f"/v1/documents/{document_id}").json()
        if doc["status"] in ("ready", "failed"):
            return doc
        time.sleep(0.2)
    raise TimeoutError(f"document {document_id} not ready: {doc}")
