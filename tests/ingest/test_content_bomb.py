"""PDF content bombs (issue 13, item 4): a page whose content inflates far beyond the file is
read in a reader process under a memory cap and a hard time limit, and the document fails
with a message that names the limit instead of taking the process down."""

from __future__ import annotations

import resource

import pytest

from lab.ingest.bad_pdfs import content_bomb_pdf
from worker.ingest import (
    PageMemoryLimitError,
    PageTimeLimitError,
    ReaderLimits,
    iter_pages,
    open_pdf,
)
from worker.uploads import check_upload


def _numbers(data: bytes, limits: ReaderLimits, seen: list[int]) -> None:
    for page in iter_pages(data, dpi=50, max_pixels=10**6, ocr=False, limits=limits):
        seen.append(page.number)


def test_the_bomb_passes_the_upload_checks() -> None:
    data = content_bomb_pdf(1024, kind="spaces")  # 1 GiB of content in a 1 MiB file
    assert len(data) < 2 * 2**20
    checked = check_upload(data, password=None, max_bytes=2 * 2**20, max_pages=10)
    assert checked.page_count == 2


def test_a_page_past_the_memory_cap_fails_naming_the_limit() -> None:
    data = content_bomb_pdf(128, kind="string")  # one 128 MiB string: MuPDF buffers it whole
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seen: list[int] = []
    with pytest.raises(PageMemoryLimitError) as info:
        _numbers(data, ReaderLimits(memory_mb=400, page_seconds=300), seen)
    assert seen == [1]  # the ordinary page came through first
    assert info.value.page == 2
    assert "Page 2 needs more than the 400 MiB memory limit" in info.value.message
    assert "CONDUIT_PAGE_MEMORY_MB" in info.value.message
    # the content was never inflated in this process
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024


def test_a_page_past_the_time_limit_fails_naming_the_limit() -> None:
    # 16 MiB of page-sized fills: about 90 s of CPU at 50 dpi here, far past the 5 s limit on
    # any machine (128 MiB of "paths" took only 10 s here: a fast or idle machine read it)
    data = content_bomb_pdf(16, kind="fills")
    with open_pdf(data, max_pages=10) as doc:  # opening reads no content
        assert doc.page_count == 2
    seen: list[int] = []
    with pytest.raises(PageTimeLimitError) as info:
        _numbers(data, ReaderLimits(memory_mb=2048, page_seconds=5), seen)
    assert seen == [1]
    assert info.value.message == (
        "Page 2 took longer than the 5 s time limit for reading one page "
        "(CONDUIT_PAGE_TIMEOUT_S); the reader was stopped.")
