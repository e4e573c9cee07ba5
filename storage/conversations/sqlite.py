"""Conversations in SQLite (the embedded form): a table of conversation headers, one of
their turns and one of their claims (the holder of a turn in flight, until when), in the
metadata database's file (WAL mode, one connection per store; a claim is taken in an
immediate transaction, so processes sharing the file see one holder)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from storage.conversations.records import Conversation, ConversationId, StoredTurn
from storage.errors import NotFoundError, QuotaExceededError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, header TEXT NOT NULL,
    updated_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS conversations_by_tenant ON conversations (tenant, updated_at);
CREATE TABLE IF NOT EXISTS conversation_turns (
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    number INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (conversation_id, number));
CREATE TABLE IF NOT EXISTS conversation_claims (
    conversation_id TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL);
"""


class SQLiteConversationStore:
    """`ConversationStore` over one SQLite file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.RLock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._conn.executescript(_SCHEMA)

    def create(self, conversation: Conversation, limit: int) -> None:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                used = self.count(conversation.tenant)
                if limit and used + 1 > limit:
                    raise QuotaExceededError("conversations", limit, used, 1)
                self._conn.execute(
                    "INSERT INTO conversations (id, tenant, header, updated_at) "
                    "VALUES (?, ?, ?, ?)", (conversation.id, conversation.tenant,
                                            conversation.header_json(), conversation.updated_at))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def get(self, conversation_id: ConversationId) -> Conversation:
        with self._lock:
            row = self._conn.execute("SELECT header, updated_at FROM conversations WHERE id = ?",
                                     (conversation_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"conversation {conversation_id} not found")
            bodies = self._conn.execute(
                "SELECT body FROM conversation_turns WHERE conversation_id = ? ORDER BY number",
                (conversation_id,)).fetchall()
        conversation = Conversation.from_header(row[0], [StoredTurn.from_json(b[0])
                                                         for b in bodies])
        conversation.updated_at = row[1]
        return conversation

    def list(self, tenant: str) -> list[Conversation]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT header, updated_at FROM conversations WHERE tenant = ? "
                "ORDER BY updated_at DESC, id", (tenant,)).fetchall()
        out = []
        for header, updated_at in rows:
            conversation = Conversation.from_header(header, [])
            conversation.updated_at = updated_at
            out.append(conversation)
        return out

    def count(self, tenant: str) -> int:
        with self._lock:
            (n,) = self._conn.execute("SELECT COUNT(*) FROM conversations WHERE tenant = ?",
                                      (tenant,)).fetchone()
        return int(n)

    def append(self, conversation_id: ConversationId, turn: StoredTurn) -> None:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                touched = self._conn.execute(
                    "UPDATE conversations SET updated_at = ? WHERE id = ?",
                    (time.time(), conversation_id)).rowcount
                if not touched:
                    raise NotFoundError(f"conversation {conversation_id} not found")
                self._conn.execute(
                    "INSERT INTO conversation_turns (conversation_id, number, body) VALUES "
                    "(?, (SELECT COUNT(*) FROM conversation_turns WHERE conversation_id = ?), ?)",
                    (conversation_id, conversation_id, turn.to_json()))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def delete(self, conversation_id: ConversationId) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            self._conn.execute("DELETE FROM conversation_claims WHERE conversation_id = ?",
                               (conversation_id,))

    def claim(self, conversation_id: ConversationId, holder: str, ttl_s: float) -> bool:
        now = time.time()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("DELETE FROM conversation_claims WHERE conversation_id = ? "
                                   "AND expires_at < ?", (conversation_id, now))
                taken = self._conn.execute(
                    "INSERT OR IGNORE INTO conversation_claims (conversation_id, holder, "
                    "expires_at) VALUES (?, ?, ?)",
                    (conversation_id, holder, now + ttl_s)).rowcount
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return bool(taken)

    def release(self, conversation_id: ConversationId, holder: str) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM conversation_claims WHERE conversation_id = ? "
                               "AND holder = ?", (conversation_id, holder))
