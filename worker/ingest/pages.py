"""Walk a document page by page in sandboxed reader processes: render, read text (OCR when
needed), report progress, honour the document's deadline, and report unreadable pages."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Literal

import pymupdf
from PIL import Image

from worker.ingest.deadline import Deadline
from worker.ingest.errors import CorruptPdfError, IngestTimeoutError, UnreadableDocumentError
from worker.ingest.frames import ReaderGone
from worker.ingest.render import capped_zoom
from worker.ingest.sandbox import PageReader, PageResult, PdfFacts, ReaderLimits
from worker.ingest.text import DEFAULT_TEXT_POLICY, PageText, TextPolicy

Stage = Literal["render", "text", "index", "prefill"]

# Seconds a page waits for a free reader before another reader is started.
_GROW_AFTER = 0.5
# Seconds the first reader of a walk without a deadline waits for the reader budget.
_NO_DEADLINE_WAIT_S = 3600.0


@dataclass(frozen=True)
class Progress:
    """One progress event: `done` of `total` pages have finished `stage`."""

    stage: Stage
    done: int
    total: int


ProgressCallback = Callable[[Progress], None]


@dataclass
class IngestedPage:
    """One page after ingestion: 1-based `number`, its image (None if not rendered), its text.

    `error` is set (and the image None, the text empty) when the page cannot be read: it is
    damaged, or its content is missing from the file.
    """

    number: int
    text: PageText
    image: Image.Image | None
    width: int
    height: int
    error: str | None = None


def iter_pages(
    data: bytes,
    *,
    dpi: int,
    max_pixels: int,
    ocr: bool,
    password: str | None = None,
    render: bool = True,
    deadline: Deadline | None = None,
    on_progress: ProgressCallback | None = None,
    text_policy: TextPolicy = DEFAULT_TEXT_POLICY,
    ocr_workers: int = 1,
    limits: ReaderLimits | None = None,
    max_pages: int | None = None,
    on_open: Callable[[PdfFacts], None] | None = None,
) -> Iterator[IngestedPage]:
    """Yield every page of the PDF `data` in order, rendered (if `render`) and with its text.

    Pages are read by up to `ocr_workers` reader processes at once (`worker.ingest.sandbox`),
    each under `limits`; a page past a limit raises `PageMemoryLimitError` or
    `PageTimeLimitError`, and a damaged page is yielded with `error` set. Reports
    `Progress("render", i, n)` and `Progress("text", i, n)` after each page through
    `on_progress`; the caller reports its own "index" and "prefill" stages with the same
    type. Past the `deadline`, raises `IngestTimeoutError` (and stops the readers at once).
    The first reader waits for the process's reader budget (`worker.ingest.budget`) until
    the deadline (`ReaderBudgetError` past it); a further reader starts only while the
    budget has room at once, else the pages are read by the readers already running.
    `width`/`height` are the rendered size, or the size a render would have when not
    rendering. The first reader opens the document (raising what `open_pdf` raises, with
    `max_pages`, or `OpenLimitError`) and its facts go to `on_open` before any page.
    """
    report = on_progress or (lambda _p: None)
    budget_wait = _NO_DEADLINE_WAIT_S if deadline is None else max(
        deadline.seconds - deadline.elapsed, 0.0)
    with _Readers(data, password, limits or ReaderLimits(), max(1, ocr_workers),
                  max_pages, budget_wait) as readers:
        if on_open is not None:
            on_open(readers.facts)
        total = readers.page_count

        def read(index: int) -> PageResult:
            return readers.read(index, render=render, dpi=dpi, max_pixels=max_pixels, ocr=ocr,
                                policy=text_policy)

        window = 2 * readers.workers
        pending: dict[int, Future[PageResult]] = {}
        for index in range(total):
            for ahead in range(index, min(index + window, total)):
                if ahead not in pending:
                    pending[ahead] = readers.pool.submit(read, ahead)
            result = _wait(pending.pop(index), deadline, index, total)
            if render:
                report(Progress("render", index + 1, total))
            report(Progress("text", index + 1, total))
            yield _page(result, dpi, max_pixels)


def check_readable(total: int, unreadable: list[IngestedPage], truncated: bool) -> None:
    """Decide whether a document whose `unreadable` pages could not be read is usable.

    Raises `UnreadableDocumentError` when no page could be read, and `CorruptPdfError` when
    the file looks truncated (`pdf.looks_truncated`) and its last pages are the unreadable
    ones: the end of the file is missing. Otherwise the document is ready without them.
    """
    if not unreadable:
        return
    if len(unreadable) >= total:
        raise UnreadableDocumentError(total, unreadable[0].error or "unreadable")
    numbers = {p.number for p in unreadable}
    if truncated and total in numbers:
        first = total
        while first - 1 in numbers:
            first -= 1
        raise CorruptPdfError(f"the file appears truncated: pages {first} to {total} of "
                              f"{total} cannot be read")


def _page(result: PageResult, dpi: int, max_pixels: int) -> IngestedPage:
    if result.image is not None:
        width, height = result.image.size
    else:
        zoom = capped_zoom_for(result.width_pt, result.height_pt, dpi, max_pixels)
        width, height = int(result.width_pt * zoom), int(result.height_pt * zoom)
    return IngestedPage(number=result.index + 1, text=result.text, image=result.image,
                        width=width, height=height, error=result.error)


def capped_zoom_for(width_pt: float, height_pt: float, dpi: int, max_pixels: int) -> float:
    """`capped_zoom` of a page `width_pt` x `height_pt` points (0 for an unreadable page)."""
    if width_pt <= 0 or height_pt <= 0:
        return 0.0
    return capped_zoom(pymupdf.Rect(0, 0, width_pt, height_pt), dpi=dpi, max_pixels=max_pixels)


def _wait(future: Future[PageResult], deadline: Deadline | None, index: int,
          total: int) -> PageResult:
    """The page's result, waiting no longer than the deadline leaves."""
    if deadline is None:
        return future.result()
    deadline.check(index, total)
    try:
        return future.result(timeout=max(deadline.seconds - deadline.elapsed, 0.0))
    except FutureTimeout:
        raise IngestTimeoutError(deadline.seconds, index, total) from None


class _Readers:
    """Up to `workers` reader processes of one document, started as pages need them, and
    threads that talk to them. Closing kills every reader, so nothing outlives the walk."""

    def __init__(self, data: bytes, password: str | None, limits: ReaderLimits,
                 workers: int, max_pages: int | None = None,
                 budget_wait_s: float = 0.0) -> None:
        self._data, self._password, self._limits = data, password, limits
        self._max_pages = max_pages
        self._idle: queue.Queue[PageReader] = queue.Queue()
        self._all: list[PageReader] = []
        self._lock = threading.Lock()
        self._closed = False
        self._starting = 0
        self._start_error: BaseException | None = None
        # the page count, and open errors, come from the first one (which may wait for the
        # reader budget; the others start only when it has room at once)
        first = self._start(budget_wait_s)
        self.facts = first.facts
        self.page_count = first.page_count
        self.workers = max(1, min(workers, self.page_count))
        self._idle.put(first)
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="page-reader")

    def _start(self, budget_wait_s: float = 0.0) -> PageReader:
        reader = PageReader(self._data, password=self._password, limits=self._limits,
                            max_pages=self._max_pages, budget_wait_s=budget_wait_s)
        with self._lock:
            self._all.append(reader)
            if self._closed:  # closed while this one started
                reader.close()
        return reader

    def read(self, index: int, **kw: object) -> PageResult:
        """Read one page with an idle reader, starting one if fewer than `workers` run."""
        reader = self._take()
        try:
            return reader.read(index, **kw)  # type: ignore[arg-type]
        finally:
            if reader.alive:
                self._idle.put(reader)

    def _take(self) -> PageReader:
        """An idle reader. When a page has waited `_GROW_AFTER` seconds for one and fewer
        than `workers` are alive, another is started in the background (pages that take
        that long are OCR pages, worth a second process; a text page never waits that long,
        so a text document never pays for a second start)."""
        waited = 0.0
        while True:
            try:
                return self._idle.get(timeout=0.1)
            except queue.Empty:
                waited += 0.1
            with self._lock:
                if self._closed:
                    raise ReaderGone()
                if self._start_error is not None:
                    raise self._start_error
                alive = sum(r.alive for r in self._all) + self._starting
                grow = alive < self.workers and (alive == 0 or waited >= _GROW_AFTER)
                if grow:
                    self._starting += 1
            if grow:
                threading.Thread(target=self._start_in_background, daemon=True).start()

    def _start_in_background(self) -> None:
        try:
            reader = self._start()
        except BaseException as exc:  # noqa: BLE001 - handed to the pages waiting for it
            with self._lock:
                self._starting -= 1
                if not any(r.alive for r in self._all):
                    self._start_error = exc
            return
        with self._lock:
            self._starting -= 1
        if reader.alive:
            self._idle.put(reader)

    def __enter__(self) -> _Readers:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._closed = True
            readers = list(self._all)
        for reader in readers:
            reader.close()
        self.pool.shutdown(wait=True, cancel_futures=True)
