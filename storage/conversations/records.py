"""The records of a stored conversation and the protocol both stores keep.

A conversation belongs to one tenant and one collection (optionally some of its documents);
its turns are appended, never edited. A stored turn keeps what a follow-up needs to read it
again (its question, its answer's text, the pages it added) and what `GET` shows (its
citations and figures, as the answer gave them: JSON objects). The stores bound how many
conversations a tenant keeps (`create`'s `limit`) and hold one claim per conversation, so
that its turns are asked one at a time across processes (`claim`); what is read of them,
their turns' count and their expiry are the worker's to decide.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, NewType, Protocol

from storage.text_safety import safe_value

ConversationId = NewType("ConversationId", str)


@dataclass(frozen=True)
class StoredTurn:
    """One answered turn."""

    question: str
    answer: str
    added_pages: list[str]  # "document_id:number" of the pages it added, in reading order
    citations: list[dict[str, Any]]  # as the answer cited them
    details: dict[str, Any]  # the answer's figures (policy, FLOPs ratio, cache, timings)
    created_at: float = field(default_factory=time.time)

    def to_json(self) -> str:
        """The turn as JSON text (valid UTF-8: `safe_value`)."""
        return json.dumps(safe_value(asdict(self)))

    @classmethod
    def from_json(cls, text: str) -> StoredTurn:
        """Inverse of `to_json`."""
        return cls(**json.loads(text))


@dataclass
class Conversation:
    """A tenant's conversation over a collection, its turns oldest first."""

    id: ConversationId
    tenant: str
    collection_id: str
    document_ids: list[str] | None = None
    title: str = ""
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    turns: list[StoredTurn] = field(default_factory=list)

    def header_json(self) -> str:
        """Everything but the turns, as JSON text."""
        head = {k: v for k, v in asdict(self).items() if k != "turns"}
        return json.dumps(safe_value(head))

    @classmethod
    def from_header(cls, text: str, turns: list[StoredTurn]) -> Conversation:
        """Inverse of `header_json`, with the turns."""
        head = json.loads(text)
        return cls(**{**head, "id": ConversationId(head["id"]), "turns": turns})


class ConversationStore(Protocol):
    """Where conversations are kept (module docstring); `NotFoundError` for an unknown id."""

    def create(self, conversation: Conversation, limit: int) -> None:
        """Store a new conversation; `QuotaExceededError` when its tenant already keeps
        `limit` (0: no limit)."""
        ...

    def get(self, conversation_id: ConversationId) -> Conversation:
        """The conversation with its turns."""
        ...

    def list(self, tenant: str) -> list[Conversation]:
        """The tenant's conversations, most recently updated first, without their turns."""
        ...

    def count(self, tenant: str) -> int:
        """How many conversations the tenant keeps."""
        ...

    def append(self, conversation_id: ConversationId, turn: StoredTurn) -> None:
        """Add a turn (and touch the conversation's `updated_at`)."""
        ...

    def delete(self, conversation_id: ConversationId) -> None:
        """Remove the conversation and its turns (nothing when it is gone already)."""
        ...

    def claim(self, conversation_id: ConversationId, holder: str, ttl_s: float) -> bool:
        """Take the conversation's one turn in flight for `holder`: False while another
        holder's claim is live. A claim lapses after `ttl_s` (a holder that died)."""
        ...

    def release(self, conversation_id: ConversationId, holder: str) -> None:
        """End `holder`'s claim (nothing when it lapsed or another holder took it since)."""
        ...
