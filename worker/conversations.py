"""Stored conversations as the service offers them: created over a collection, asked in
turns, read back, listed and deleted, each tenant's own.

What it decides: a conversation is its tenant's alone (another tenant's id is the same
`NotFoundError` as an unknown one); one untouched for `conversation_ttl_s` has expired and
is removed when next read (the same 404); a tenant keeps at most `conversation_max_stored`
(`QuotaExceededError`, 413) and a conversation holds at most `conversation_turn_limit` turns
(`ConversationFullError`, 409). A conversation answers one message at a time: a message
posted while another of the same conversation is being answered gets
`ConversationBusyError` (409), in any process of the deployment (the store's claim, lapsing
after the longest an answer may take when its process died). A message is a follow-up
`Question` whose history is the stored turns with the pages each added, read once its claim
is held, and whose KV is kept for the next message.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from storage.conversations import (
    Conversation,
    ConversationId,
    ConversationStore,
    RedisConversationStore,
    SQLiteConversationStore,
    StoredTurn,
)
from storage.errors import NotFoundError
from storage.metadata import CollectionId, new_id
from worker.answer_job import Answer, Question
from worker.context import WorkerContext
from worker.conversation_turns import PastTurn
from worker.errors import WorkerError


class ConversationFullError(WorkerError):
    """A message to a conversation that holds its limit of turns."""

    http_status = 409


class ConversationBusyError(WorkerError):
    """A message to a conversation while another of its messages is being answered."""

    http_status = 409


def open_store(ctx: WorkerContext) -> ConversationStore:
    """The conversation store of the deployment's form: Redis when it runs distributed,
    else SQLite in the home."""
    url = ctx.settings.storage.redis_url
    if url:
        return RedisConversationStore(url)
    return SQLiteConversationStore(ctx.home / "conversations.sqlite3")


class Conversations:
    """The tenant-scoped operations on stored conversations (module docstring)."""

    def __init__(self, ctx: WorkerContext, store: ConversationStore) -> None:
        self._ctx = ctx
        self.store = store

    @property
    def _ttl_s(self) -> float:
        return self._ctx.settings.worker.conversation_ttl_s

    def create(self, tenant: str, collection_id: CollectionId,
               document_ids: list[str] | None, title: str) -> Conversation:
        """A new, empty conversation of `tenant` over the collection (checked by the caller)."""
        conversation = Conversation(id=ConversationId(new_id("conv")), tenant=tenant,
                                    collection_id=collection_id, document_ids=document_ids,
                                    title=title)
        self.store.create(conversation, self._ctx.settings.worker.conversation_max_stored)
        return conversation

    def get(self, tenant: str, conversation_id: str) -> Conversation:
        """The tenant's conversation with its turns; `NotFoundError` for an unknown, expired
        or other tenant's id alike."""
        try:
            conversation = self.store.get(ConversationId(conversation_id))
        except NotFoundError:
            conversation = None
        if conversation is not None and conversation.updated_at + self._ttl_s < time.time():
            self.store.delete(conversation.id)
            conversation = None
        if conversation is None or conversation.tenant != tenant:
            raise NotFoundError(f"conversation {conversation_id} not found")
        return conversation

    @contextmanager
    def turn(self, tenant: str, conversation_id: str) -> Iterator[Conversation]:
        """The tenant's conversation (`get`'s 404s), read while this turn holds its claim,
        released on leaving; `ConversationBusyError` while another turn holds it."""
        conversation = self.get(tenant, conversation_id)
        holder = new_id("turn")
        s = self._ctx.settings.worker
        if not self.store.claim(conversation.id, holder,
                                s.answer_queue_wait_s + s.answer_timeout_s):
            raise ConversationBusyError(
                f"conversation {conversation_id} is answering another message: send this "
                "one once that answer is done")
        try:
            yield self.get(tenant, conversation_id)  # the turns the other one may have added
        finally:
            self.store.release(conversation.id, holder)

    def of_tenant(self, tenant: str) -> list[Conversation]:
        """The tenant's live conversations, most recent first (the expired removed)."""
        now = time.time()
        live = []
        for conversation in self.store.list(tenant):
            if conversation.updated_at + self._ttl_s < now:
                self.store.delete(conversation.id)
            else:
                live.append(conversation)
        return live

    def count(self, tenant: str) -> int:
        """How many conversations the tenant keeps (expired ones until next read)."""
        return self.store.count(tenant)

    def delete(self, tenant: str, conversation_id: str) -> None:
        """Remove the tenant's conversation (`NotFoundError` as `get`)."""
        self.store.delete(self.get(tenant, conversation_id).id)

    def follow_up(self, conversation: Conversation, question: Question) -> Question:
        """`question` as the conversation's next turn: its scope, its history, its KV kept;
        `ConversationFullError` when the conversation holds its limit of turns."""
        limit = self._ctx.settings.worker.conversation_turn_limit
        if limit and len(conversation.turns) >= limit:
            raise ConversationFullError(
                f"this conversation holds {len(conversation.turns)} turns, the limit "
                "(CONDUIT_CONVERSATION_TURN_LIMIT): start a new conversation")
        history = tuple(PastTurn(t.question, t.answer, tuple(t.added_pages))
                        for t in conversation.turns)
        return replace(question, history=history, keep=True)

    def record(self, conversation: Conversation, question: str, answer: Answer,
               citations: list[dict[str, Any]], details: dict[str, Any]) -> StoredTurn:
        """Append the answered turn to the conversation."""
        turn = StoredTurn(question=question, answer=answer.answer,
                          added_pages=list(answer.added_pages), citations=citations,
                          details=details)
        self.store.append(conversation.id, turn)
        return turn
