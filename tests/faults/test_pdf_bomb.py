"""The object-stream bomb over real HTTP (issue 30, point 1): a 1 MB and a 10 MB upload whose
page tree inflates to 1 GB and 10 GB at open are refused with a 422 naming the limit, the
API process's peak memory grows by under 50 MB, nothing is stored, and the service goes on
answering (and accepting ordinary PDFs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lab.ingest.builders import text_pages_pdf
from lab.ingest.objstm_bomb import objstm_bomb_pdf
from tests.faults.conftest import start_serve

MIB = 1 << 20


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, int]]:
    home = tmp_path_factory.mktemp("bomb")
    # the default reader limits (2048 MiB, 300 s); uploads up to 16 MiB
    url, proc = start_serve(home, {"CONDUIT_MAX_UPLOAD_BYTES": str(16 * MIB),
                                   "CONDUIT_OCR": "false"})
    yield url, home, proc.pid
    proc.terminate()
    proc.wait(timeout=30)


def _peak_rss_kib(pid: int) -> int:
    """The process's peak resident memory (VmHWM) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _stored(home: Path) -> list[Path]:
    return sorted((home / "uploads").glob("*")) if (home / "uploads").exists() else []


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_the_object_stream_bomb_is_refused_without_growing_the_api_process(
        service: tuple[str, Path, int]) -> None:
    url, home, pid = service
    client = httpx.Client(base_url=url, timeout=300)
    col = client.post("/v1/collections", json={"name": "bombs"}).json()["collection_id"]
    grown = {}
    for compressed in (1_000_000, 10_000_000):  # inflating to 1 GB and 10 GB
        bomb = objstm_bomb_pdf(compressed)
        assert compressed <= len(bomb) < compressed + MIB
        before = _peak_rss_kib(pid)
        r = client.post(f"/v1/collections/{col}/documents",
                        files={"file": ("bomb.pdf", bomb, "application/pdf")})
        grown[compressed] = (_peak_rss_kib(pid) - before) / 1024
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "2048 MiB memory limit" in detail and "CONDUIT_PAGE_MEMORY_MB" in detail, detail
        # nothing half-written, and the service answers the next request
        listed = client.get(f"/v1/collections/{col}/documents")
        assert listed.status_code == 200 and listed.json() == []
        assert _stored(home) == []
        assert client.get("/healthz").status_code == 200
    print(f"API process peak RSS growth (MiB): {grown}")
    # before the fix: 2 GB for the 1 MB file, and the process killed for the 10 MB one
    assert all(mib < 50 for mib in grown.values()), grown
    ok = client.post(f"/v1/collections/{col}/documents",
                     files={"file": ("ok.pdf", text_pages_pdf(["The ferry leaves at nine."]),
                                     "application/pdf")})
    assert ok.status_code == 202, ok.text
