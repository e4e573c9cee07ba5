"""Loading the retrieved pages' KV for an answer, and the answer's cache report: which tier
served each page and how many pages had to be prefilled for this question."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from conduit_core.page_kv import PageKV
from storage.keys import PageHash
from storage.metadata import Page
from worker.context import WorkerContext
from worker.ingest_job import prefill_now


@dataclass(frozen=True)
class CacheReport:
    """Where an answer's page KV came from, counted over distinct pages (two retrieved pages
    with the same hash are one entry). `pages_from` maps each tier of the stack (memory, redis,
    disk; zero when it served none) to the pages read from it; `pages_prefilled_now` counts pages
    whose KV was not stored (never prefilled, evicted or corrupt) and was computed for this
    question. Every distinct page is counted exactly once across the two."""

    pages_from: dict[str, int] = field(default_factory=dict)
    pages_prefilled_now: int = 0
    head_tokens: int = 0  # leading prompt tokens (template + instructions) from the head cache
    conversation: str = ""  # a follow-up's earlier turns: "hit" (their KV kept) or "rebuilt"


@dataclass(frozen=True)
class LoadedPages:
    """The pages' KV by hash, the cache report, and the time spent reading and prefilling."""

    kvs: dict[PageHash, PageKV]
    report: CacheReport
    load_s: float
    prefill_s: float


def load_pages(ctx: WorkerContext, pages: Sequence[Page]) -> LoadedPages:
    """Read every page's KV through the tiers; prefill (and store) the pages that missed.

    A page that misses on read is deleted from every tier first (a stale index entry: a disk
    file that failed verification, a Redis key that expired mid-read), then prefilled, and the
    answer uses the KV it computed. It is not read back: concurrent questions that miss the
    same page (one of a document still being ingested) each delete and store it, and a
    read-back could find another question's delete.
    """
    hashes = list(dict.fromkeys(PageHash(p.page_hash) for p in pages))
    t0 = time.perf_counter()
    kvs, served_by = ctx.kv.get_many_traced(hashes)
    t_read = time.perf_counter()
    missing = [h for h in hashes if h not in kvs]
    if missing:
        ctx.kv.delete(missing)
        wanted = set(missing)
        todo = {PageHash(p.page_hash): p for p in pages if p.page_hash in wanted}
        kvs.update(prefill_now(ctx, list(todo.values())))
    t_done = time.perf_counter()
    counts = Counter(served_by.values())
    report = CacheReport(pages_from={name: counts.get(name, 0) for name, _ in ctx.kv.tiers},
                         pages_prefilled_now=len(missing))
    return LoadedPages(kvs=kvs, report=report, load_s=t_read - t0, prefill_s=t_done - t_read)
