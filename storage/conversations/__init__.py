"""Stored conversations: a tenant's turns over a collection, in SQLite (embedded) or Redis
(distributed), the same records and semantics in both (`ConversationStore`)."""

from storage.conversations.records import (
    Conversation,
    ConversationId,
    ConversationStore,
    StoredTurn,
)
from storage.conversations.redis_store import RedisConversationStore
from storage.conversations.sqlite import SQLiteConversationStore

__all__ = ["Conversation", "ConversationId", "ConversationStore", "RedisConversationStore",
           "SQLiteConversationStore", "StoredTurn"]
