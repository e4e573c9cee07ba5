"""Question-time page KV (`worker.page_cache.load_pages`): pages missing from every tier are
prefilled and the answer uses the KV it computed, so concurrent questions that miss the same
pages (a document still being ingested) do not fail on each other's delete. Real tiny model,
real engine, real disk tier."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

import pytest

from conduit_core.page_kv import PageKV
from storage.keys import PageHash
from storage.metadata import Page
from storage.metadata.records import DocumentId
from tests.core.helpers import IMAGES
from worker.context import WorkerContext, build_context
from worker.ingest_job import ensure_prefilled
from worker.page_cache import load_pages
from worker.settings import Settings


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerContext]:
    context = build_context(Settings(home=tmp_path_factory.mktemp("page-cache"),
                                     model="builtin:tiny-qwen2-vl", memory_kv_bytes=0))
    yield context
    context.close()


def _pages(ctx: WorkerContext, tag: str) -> list[Page]:
    """Two pages with hashes of their own (`tag`: one hex digit per test)."""
    pages = []
    for i, key in enumerate("ab"):
        path = f"pages/p{i}.png"
        (ctx.home / "pages").mkdir(exist_ok=True)
        IMAGES[key].save(ctx.home / path)
        pages.append(Page(document_id=DocumentId("d"), number=i + 1,
                          page_hash=f"{i}{tag}" * 32, text="", text_source="text_layer",
                          image_path=path, width=1, height=1))
    return pages


def test_missing_pages_are_prefilled_and_used_even_when_another_question_deletes_them(
        ctx: WorkerContext) -> None:
    pages = _pages(ctx, "a")
    real_put = ctx.kv.put_many

    def put_then_lose(entries: Mapping[PageHash, PageKV]) -> None:
        real_put(entries)
        ctx.kv.delete(list(entries))  # another question that missed them deletes them now
    ctx.kv.put_many = put_then_lose  # type: ignore[method-assign,assignment]
    try:
        loaded = load_pages(ctx, pages)
    finally:
        ctx.kv.put_many = real_put  # type: ignore[method-assign,assignment]
    assert set(loaded.kvs) == {PageHash(p.page_hash) for p in pages}
    assert loaded.report.pages_prefilled_now == 2
    assert all(kv.num_tokens > 0 for kv in loaded.kvs.values())


def test_concurrent_questions_missing_the_same_pages_all_get_them(ctx: WorkerContext) -> None:
    pages = _pages(ctx, "b")
    errors: list[BaseException] = []
    got: list[int] = []

    def ask() -> None:
        try:
            got.append(len(load_pages(ctx, pages).kvs))
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)
    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and got == [2] * 6
    again = load_pages(ctx, pages)  # stored: served from the disk tier now
    assert again.report.pages_prefilled_now == 0


def test_ingest_prefill_counts_stored_pages_then_each_batch(ctx: WorkerContext) -> None:
    first, second = _pages(ctx, "c"), _pages(ctx, "d")
    load_pages(ctx, first[:1])  # one page stored already
    seen: list[int] = []
    computed = ensure_prefilled(ctx, [*first, *second], on_done=seen.append)
    assert computed == 3
    assert seen[0] == 1 and seen[-1] == 4 and seen == sorted(seen)  # progress, never back
    assert ctx.kv.contains([PageHash(p.page_hash) for p in [*first, *second]]) == \
        {PageHash(p.page_hash) for p in [*first, *second]}
