"""Conversations in Redis (the distributed form): a header string, a list of turns and a
per-tenant sorted set by update time, under `prefix`:

    conv:<id> (string, header JSON)   convturns:<id> (list of turn JSON)
    convtenant:<tenant> (zset of ids by updated_at)
    convclaim:<id> (string, the holder of its turn in flight; expires)

A tenant's count is checked and a conversation added in one transaction (WATCH on the
tenant's set), so that two concurrent creations cannot both pass the limit. A claim is a
`SET NX` with an expiry, released only by its holder (a compare-and-delete script)."""

from __future__ import annotations

import time

import redis

from storage.conversations.records import Conversation, ConversationId, StoredTurn
from storage.errors import NotFoundError, QuotaExceededError, UnavailableError

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisConversationStore:
    """`ConversationStore` over one Redis."""

    def __init__(self, url: str, *, prefix: str = "conduit:meta") -> None:
        self.prefix = prefix
        self._r = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=2.0,
                                       socket_timeout=30.0)

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def create(self, conversation: Conversation, limit: int) -> None:
        tenant_key = self._k("convtenant", conversation.tenant)
        try:
            with self._r.pipeline() as pipe:
                while True:
                    try:
                        pipe.watch(tenant_key)
                        used = int(pipe.zcard(tenant_key))
                        if limit and used + 1 > limit:
                            raise QuotaExceededError("conversations", limit, used, 1)
                        pipe.multi()
                        pipe.set(self._k("conv", conversation.id), conversation.header_json())
                        pipe.zadd(tenant_key, {conversation.id: conversation.updated_at})
                        pipe.execute()
                        return
                    except redis.WatchError:
                        continue
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise UnavailableError(f"metadata Redis unreachable: {exc}") from exc

    def _header(self, conversation_id: ConversationId) -> tuple[str, str]:
        header = self._r.get(self._k("conv", conversation_id))
        if header is None:
            raise NotFoundError(f"conversation {conversation_id} not found")
        return str(header), str(Conversation.from_header(str(header), []).tenant)

    def get(self, conversation_id: ConversationId) -> Conversation:
        header, tenant = self._header(conversation_id)
        turns = self._r.lrange(self._k("convturns", conversation_id), 0, -1)
        conversation = Conversation.from_header(header,
                                                [StoredTurn.from_json(str(t)) for t in turns])
        score = self._r.zscore(self._k("convtenant", tenant), conversation_id)
        if score is not None:
            conversation.updated_at = float(score)
        return conversation

    def list(self, tenant: str) -> list[Conversation]:
        ids = self._r.zrevrange(self._k("convtenant", tenant), 0, -1, withscores=True)
        out = []
        for conversation_id, score in ids:  # type: ignore[misc,str-unpack]
            header = self._r.get(self._k("conv", str(conversation_id)))
            if header is not None:
                conversation = Conversation.from_header(str(header), [])
                conversation.updated_at = float(score)
                out.append(conversation)
        return out

    def count(self, tenant: str) -> int:
        return int(self._r.zcard(self._k("convtenant", tenant)))

    def append(self, conversation_id: ConversationId, turn: StoredTurn) -> None:
        _, tenant = self._header(conversation_id)
        with self._r.pipeline() as pipe:
            pipe.rpush(self._k("convturns", conversation_id), turn.to_json())
            pipe.zadd(self._k("convtenant", tenant), {conversation_id: time.time()})
            pipe.execute()

    def delete(self, conversation_id: ConversationId) -> None:
        try:
            _, tenant = self._header(conversation_id)
        except NotFoundError:
            return
        with self._r.pipeline() as pipe:
            pipe.delete(self._k("conv", conversation_id), self._k("convturns", conversation_id),
                        self._k("convclaim", conversation_id))
            pipe.zrem(self._k("convtenant", tenant), conversation_id)
            pipe.execute()

    def claim(self, conversation_id: ConversationId, holder: str, ttl_s: float) -> bool:
        return bool(self._r.set(self._k("convclaim", conversation_id), holder, nx=True,
                                px=max(1, int(ttl_s * 1000))))

    def release(self, conversation_id: ConversationId, holder: str) -> None:
        self._r.eval(_RELEASE, 1, self._k("convclaim", conversation_id), holder)
