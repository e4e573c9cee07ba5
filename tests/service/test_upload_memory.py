"""Over real HTTP: hostile uploads (a zip-bomb DOCX, a decompression-bomb PNG, a TIFF of
10,000 frames, an XLSX of a million cells) are decoded only in confined readers, never in the
API process: that process's resident memory, sampled every few milliseconds during each
upload, grows by less than the reader budget (CONDUIT_READER_MEMORY_MB), which is set
smaller than the bomb's decoded pixels."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator

import httpx
import psutil
import pytest
from PIL import Image

from tests.made_files import huge_xlsx, many_frame_tiff, zip_bomb_docx
from tests.service.conftest import start_server, stop_server
from worker.ingest.formats import MAX_EXPANDED_BYTES

BUDGET_MB = 512  # the reader budget; the bomb PNG decodes to 900 MB of pixels
MIB = 2**20


@pytest.fixture(scope="module")
def budgeted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of a server whose readers share a `BUDGET_MB` budget."""
    home = tmp_path_factory.mktemp("conduit-home")
    url, proc = start_server(home, {
        "CONDUIT_READER_MEMORY_MB": str(BUDGET_MB), "CONDUIT_PAGE_MEMORY_MB": str(BUDGET_MB),
        "CONDUIT_OFFICE_TIMEOUT_S": "30", "CONDUIT_MAX_UPLOAD_BYTES": str(8 * MIB)})
    yield url, proc.pid
    stop_server(proc)


class _Sampler:
    """The peak resident memory of process `pid`, sampled every 2 ms while in use."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _bomb_png() -> bytes:
    bomb = io.BytesIO()
    Image.new("1", (30_000, 30_000)).save(bomb, "PNG")  # 900 megapixels in ~100 kB
    return bomb.getvalue()


@pytest.mark.parametrize("name", ["bomb.docx", "bomb.png", "fax.tiff", "cells.xlsx"])
def test_hostile_uploads_leave_the_api_process_within_the_reader_budget(
        budgeted: tuple[str, int], name: str) -> None:
    url, pid = budgeted
    made = {"bomb.docx": lambda: zip_bomb_docx(MAX_EXPANDED_BYTES + 1), "bomb.png": _bomb_png,
            "fax.tiff": lambda: many_frame_tiff(10_000),
            "cells.xlsx": lambda: huge_xlsx(1000, 1000)}
    data = made[name]()
    with httpx.Client(base_url=url, timeout=300) as client:
        collection = client.post("/v1/collections", json={"name": name.replace(".", "-")})
        assert collection.status_code == 201, collection.text
        before = psutil.Process(pid).memory_info().rss
        with _Sampler(pid) as sampler:
            r = client.post(f"/v1/collections/{collection.json()['collection_id']}/documents",
                            files={"file": (name, data, "application/octet-stream")})
    assert 400 <= r.status_code < 500 and r.json()["detail"], (name, r.text)
    grown = sampler.peak - before
    assert grown < BUDGET_MB * MIB, f"{name}: the API process grew {grown / MIB:.0f} MiB"
