"""The worker's side of conversations on a real context (SQLite home, no model): retrieval that
reads earlier turns weighs the recent ones more, and a conversation untouched past its
expiry is gone (the same NotFoundError as an unknown id), from its read and from the list."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from storage.errors import NotFoundError
from storage.metadata import CollectionId, DocumentId, Page
from worker.context import build_context
from worker.conversation_turns import conversation_hits
from worker.conversations import Conversations, open_store
from worker.settings import Settings


def _page(n: int) -> Page:
    return Page(document_id=DocumentId("doc_a"), number=n, page_hash=f"h{n}", text=f"page {n}",
                text_source="text_layer", image_path=f"p{n}.png", width=1, height=1)


def test_the_recent_turns_weigh_more(tmp_path: Path) -> None:
    ctx = build_context(Settings(home=tmp_path / "home", conversation_recency=0.5))
    ranked = {"oldest": [(_page(1), 1.0)], "older": [(_page(2), 0.9)],
              "now": [(_page(3), 0.3)]}

    def rank(question: str, top_k: int) -> list[tuple[Page, float]]:
        return ranked[question]

    hits = conversation_hits(ctx, ["oldest", "older", "now"], 3, rank)
    # 0.9 * 0.5 one turn back beats 1.0 * 0.25 two turns back; the question itself 0.3
    assert [(p.number, round(s, 3)) for p, s in hits] == [(2, 0.45), (3, 0.3), (1, 0.25)]
    alone = conversation_hits(ctx, ["now"], 3, rank)
    assert [p.number for p, _ in alone] == [3]


def test_an_untouched_conversation_expires(tmp_path: Path) -> None:
    ctx = build_context(Settings(home=tmp_path / "home", conversation_ttl_s=0.5))
    conversations = Conversations(ctx, open_store(ctx))
    old = conversations.create("a", CollectionId("col_1"), None, "old")
    time.sleep(0.6)
    fresh = conversations.create("a", CollectionId("col_1"), None, "fresh")
    with pytest.raises(NotFoundError, match=f"conversation {old.id} not found"):
        conversations.get("a", old.id)
    assert conversations.count("a") == 1  # removed, not only hidden
    stale = conversations.create("a", CollectionId("col_1"), None, "stale")
    time.sleep(0.6)
    assert conversations.of_tenant("a") == []  # the list drops what expired
    assert conversations.count("a") == 0
    fresh = conversations.create("a", CollectionId("col_1"), None, "fresh")
    assert stale.id != fresh.id
    with pytest.raises(NotFoundError):
        conversations.get("b", fresh.id)  # another tenant's
