"""Helpers of the fault suite: real `conduit serve` / `conduit worker` processes that a test
can SIGKILL, SIGTERM and restart on the same home, and end-state checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lab.service_process import start_server

# fast leases so that recovery takes seconds in tests (production: 60 s lease, 10 s reaper)
FAST = {"CONDUIT_JOB_LEASE_S": "3", "CONDUIT_REAPER_INTERVAL_S": "0.5",
        "CONDUIT_OCR": "false"}


def start_serve(home: Path, env: dict[str, str]) -> tuple[str, subprocess.Popen[bytes]]:
    """`lab.service_process.start_server` with the fault suite's patience: its servers start
    beside busy workers and other servers, so /healthz may take minutes to answer."""
    return start_server(home, env, timeout=900)


class Server:
    """A `conduit serve` process on one home that can be killed and started again."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, **extra: str) -> str:
        """Start (again) with the base env plus `extra`; returns the base URL."""
        self.url, self.proc = start_serve(self.home, {**self.env, **extra})
        return self.url

    def client(self, **kw: Any) -> httpx.Client:
        """An HTTP client on the current process."""
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 120), **kw)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` and wait for the process to end."""
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Terminate if running."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Make `Server`s (each on its own home under tmp_path); all are stopped at the end."""
    made: list[Server] = []

    def make(name: str = "home", **env: str) -> Server:
        home = tmp_path / name
        home.mkdir(exist_ok=True)
        server = Server(home, {**FAST, **env})
        made.append(server)
        return server

    yield make
    for s in made:
        s.stop()


def start_worker(home: Path, redis_url: str, log_name: str,
                 extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A `conduit worker` Celery process on the shared home."""
    log = open(home / log_name, "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", "worker", "--concurrency", "2"],
        env={**os.environ, **FAST, "CONDUIT_HOME": str(home), "CONDUIT_REDIS_URL": redis_url,
             "HF_HUB_OFFLINE": "1", **(extra or {})},
        stdout=log, stderr=subprocess.STDOUT)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             every: float = 0.1) -> Any:
    """Poll until `predicate()` is truthy; return it, or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def settled(client: httpx.Client, document_id: str, timeout: float = 900) -> dict[str, Any]:
    """The document once it is ready or failed (never left queued/processing)."""
    def done() -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = client.get(f"/v1/documents/{document_id}").json()
        except httpx.TransportError:  # a keep-alive connection closed under us: poll again
            return None
        return doc if doc["status"] in ("ready", "failed") else None
    result: dict[str, Any] = wait_for(done, timeout, f"document {document_id} to settle", 0.2)
    return result


def job_status(client: httpx.Client, job_id: str, timeout: float = 60) -> str:
    """The job's status once it has ended (a document is marked ready a moment before its
    job is marked succeeded)."""
    def ended() -> str | None:
        status: str = client.get(f"/v1/jobs/{job_id}").json()["status"]
        return status if status in ("succeeded", "failed") else None
    result: str = wait_for(ended, timeout, f"job {job_id} to end", 0.2)
    return result


def assert_no_orphan_files(home: Path, live_documents: set[str]) -> None:
    """Uploads and page images exist only for documents that still exist."""
    uploads = {p.stem for p in (home / "uploads").glob("*.pdf")}
    images = {p.name for p in (home / "pages").glob("*") if any(p.iterdir())}
    assert uploads <= live_documents, f"orphan uploads: {uploads - live_documents}"
    assert images <= live_documents, f"orphan page images: {images - live_documents}"
