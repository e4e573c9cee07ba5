"""Both conversation stores (SQLite, and Redis on a real redis-server) keep the same records:
turns appended in order, each tenant's list most recent first, the tenant's limit, delete,
and one claim per conversation (its turn in flight) that lapses when its holder dies."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from storage.conversations import (
    Conversation,
    ConversationId,
    ConversationStore,
    RedisConversationStore,
    SQLiteConversationStore,
    StoredTurn,
)
from storage.errors import NotFoundError, QuotaExceededError


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
          prefix: str) -> ConversationStore:
    if request.param == "sqlite":
        return SQLiteConversationStore(tmp_path / "conversations.db")
    return RedisConversationStore(redis_url, prefix=prefix)


def _turn(n: int) -> StoredTurn:
    return StoredTurn(question=f"question {n} \ud800", answer=f"answer {n}",
                      added_pages=[f"doc_a:{n}"], citations=[{"page": n}],
                      details={"cache": {"conversation": "hit"}})


def test_turns_come_back_in_order_with_what_they_cited(store: ConversationStore) -> None:
    conv = Conversation(id=ConversationId("conv_1"), tenant="a", collection_id="col_1",
                        document_ids=["doc_a"], title="valves")
    store.create(conv, limit=0)
    for n in range(3):
        store.append(conv.id, _turn(n))
    got = store.get(conv.id)
    assert [t.answer for t in got.turns] == ["answer 0", "answer 1", "answer 2"]
    assert got.turns[1].added_pages == ["doc_a:1"] and got.turns[1].citations == [{"page": 1}]
    assert got.turns[0].question.encode().startswith(b"question 0 ")  # valid UTF-8
    assert (got.tenant, got.collection_id, got.document_ids, got.title) == (
        "a", "col_1", ["doc_a"], "valves")
    assert got.updated_at >= conv.created_at


def test_a_tenants_list_its_limit_and_delete(store: ConversationStore) -> None:
    first = Conversation(id=ConversationId("conv_a1"), tenant="a", collection_id="c")
    second = Conversation(id=ConversationId("conv_a2"), tenant="a", collection_id="c")
    store.create(first, limit=2)
    store.create(second, limit=2)
    store.create(Conversation(id=ConversationId("conv_b1"), tenant="b", collection_id="c"),
                 limit=2)
    with pytest.raises(QuotaExceededError, match="2 conversations"):
        store.create(Conversation(id=ConversationId("conv_a3"), tenant="a", collection_id="c"),
                     limit=2)
    time.sleep(0.01)
    store.append(first.id, _turn(0))  # touched: listed first
    assert [c.id for c in store.list("a")] == ["conv_a1", "conv_a2"]
    assert store.count("a") == 2 and store.count("b") == 1
    store.delete(first.id)
    store.delete(first.id)  # gone already: nothing
    with pytest.raises(NotFoundError):
        store.get(first.id)
    with pytest.raises(NotFoundError):
        store.append(first.id, _turn(1))
    assert [c.id for c in store.list("a")] == ["conv_a2"]


def test_one_claim_per_conversation(store: ConversationStore) -> None:
    conv = ConversationId("conv_c1")
    store.create(Conversation(id=conv, tenant="a", collection_id="c"), limit=0)
    assert store.claim(conv, "first", ttl_s=60)
    assert not store.claim(conv, "second", ttl_s=60)  # the first's turn is in flight
    assert store.claim(ConversationId("conv_c2"), "second", ttl_s=60)  # another one's is free
    store.release(conv, "second")  # not its claim: the first's stays
    assert not store.claim(conv, "second", ttl_s=60)
    store.release(conv, "first")
    assert store.claim(conv, "second", ttl_s=0.05)
    time.sleep(0.1)  # the second died holding it: the claim lapses
    assert store.claim(conv, "third", ttl_s=60)
    store.delete(conv)  # a deleted conversation's claim goes with it
    assert store.claim(conv, "fourth", ttl_s=60)
