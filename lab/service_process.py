"""A real `conduit serve` process on a free loopback port, its home in a given folder.

The service tests start their servers with these (`tests/service/conftest.py` re-exports
them), so do the fault suite (`tests/faults/conftest.py`, restarting a server on the same
home) and the upload fuzz through HTTP (`lab/fuzz/uploads_http.py`): one way to start, wait
for and stop a served product. The server's output is appended to `home/server.log`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from lab.processes import free_port


def start_server(
    home: Path, extra_env: dict[str, str] | None = None, *, timeout: float = 300.0
) -> tuple[str, subprocess.Popen[bytes]]:
    """Start `conduit serve` and wait until /healthz answers; (base URL, process).

    The environment sets `CONDUIT_HOME=home`, offline hub access and a 2 MiB upload limit,
    then `extra_env` on top. Raises RuntimeError with the end of the server's log when it
    exits or does not answer within `timeout` seconds (importing torch alone can take a
    minute on a busy machine)."""
    port = free_port()
    env = {**os.environ, "CONDUIT_HOME": str(home), "HF_HUB_OFFLINE": "1",
           "CONDUIT_MAX_UPLOAD_BYTES": str(2 * 2**20), **(extra_env or {})}
    log = open(home / "server.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(_log_tail(home))
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return url, proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start:\n" + _log_tail(home))


def _log_tail(home: Path) -> str:
    """The last 4,000 characters of the server's log."""
    return (home / "server.log").read_text()[-4000:]


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server started by `start_server`: SIGTERM, then SIGKILL after 20 s."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def wait_ready(client: httpx.Client, document_id: str, timeout: float = 180) -> dict:
    """Poll a document until it is ready or failed; its last body. TimeoutError after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = client.get(f"/v1/documents/{document_id}").json()
        if doc["status"] in ("ready", "failed"):
            return doc
        time.sleep(0.2)
    raise TimeoutError(f"document {document_id} not ready: {doc}")
