"""Which Celery worker holds a conversation's prefix, so that its follow-ups are sent there.

A conversation's kept KV lives in the memory of the worker process that answered its last
turn (`conduit_core.conversation.ConversationCache`); a follow-up that another worker takes
rebuilds it. So each worker process also consumes an answer queue of its own
(`worker_queue`, named from its host name and process id), and says it is alive by a Redis
key it refreshes every `BEAT_S` and that lapses `BEAT_TTL_S` after its last refresh
(`Beacon`; deleted when the worker stops cleanly).

What it decides:
  A conversation is named by its route key (`route_key`): a digest of the tenant, the scope
  (collection and documents) and the text of its answered turns, which both the API process
  (from the follow-up's history) and the worker (from the turn it answered) can compute; the
  REST conversations and OpenAI chat's stateless messages give the same key for the same
  turns. A worker that answered a turn it keeps records the key of the conversation with that
  turn as its own (`Routes.record`, for `conversation_ttl_s`). A follow-up goes to the queue of
  the worker recorded for its history while that worker's key is alive (`Routes.queue_for`),
  else to the shared answer queue, where any worker takes it and rebuilds the prefix. The key
  is a hint: the worker still checks its kept prefix by its own exact key, so a stale route
  costs a rebuild, never a wrong answer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import threading
from collections.abc import Sequence

import redis

from worker.answer_job import Question
from worker.conversation_turns import PastTurn

log = logging.getLogger(__name__)

SHARED_QUEUE = "conduit.answer"  # the answer queue every worker consumes
ROUTE_PREFIX = "conduit:route:"  # + route key: the id of the worker holding that prefix
ALIVE_PREFIX = "conduit:worker-alive:"  # + worker id: present while the worker runs
BEAT_S = 2.0  # a worker refreshes its key this often
BEAT_TTL_S = 6.0  # and the key lapses this long after the last refresh (a dead worker's)


def worker_id() -> str:
    """This process's worker id: its host name and process id (a pod's host name is its
    name, so a restarted pod consumes the queue its predecessor left)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname()) or "host"
    return f"{host}.{os.getpid()}"


def worker_queue(holder: str) -> str:
    """The answer queue that only the worker `holder` consumes."""
    return f"{SHARED_QUEUE}.{holder}"


def route_key(question: Question, turns: Sequence[PastTurn]) -> str:
    """The route key of `question`'s conversation after `turns` (module docstring)."""
    docs = None if question.document_ids is None else sorted(question.document_ids)
    text = json.dumps([question.tenant, question.collection_id, docs,
                       [[t.question, t.answer] for t in turns]], ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


class Routes:
    """The route records and the workers' liveness keys in Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def record(self, question: Question, answer_text: str, holder: str, ttl_s: float) -> None:
        """Record `holder` as the worker keeping the conversation that `question` with its
        answer now makes."""
        turns = (*question.history, PastTurn(question.question, answer_text))
        self._redis.set(ROUTE_PREFIX + route_key(question, turns), holder,
                        ex=max(1, int(ttl_s)))

    def alive(self, holder: str) -> bool:
        """Whether the worker `holder` refreshed its key within `BEAT_TTL_S`."""
        return bool(self._redis.exists(ALIVE_PREFIX + holder))

    def holder_for(self, question: Question) -> str | None:
        """The live worker recorded for a follow-up's history; None for a first turn, an
        unknown conversation or a holder whose key has lapsed."""
        if not question.history:
            return None
        raw = self._redis.get(ROUTE_PREFIX + route_key(question, question.history))
        if raw is None:
            return None
        holder = raw.decode() if isinstance(raw, bytes) else str(raw)
        return holder if self.alive(holder) else None


class Beacon:
    """A worker's liveness key, refreshed on a daemon thread from `start` until `stop`
    (which deletes it, so that follow-ups go to the shared queue at once)."""

    def __init__(self, client: redis.Redis, holder: str) -> None:
        self._redis = client
        self._key = ALIVE_PREFIX + holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conduit-beacon", daemon=True)

    def start(self) -> None:
        """Set the key now and keep refreshing it."""
        self._beat()
        self._thread.start()

    def _beat(self) -> None:
        try:
            self._redis.set(self._key, "1", px=int(BEAT_TTL_S * 1000))
        except (redis.RedisError, OSError) as exc:  # missed: follow-ups go to the shared queue
            log.warning("could not refresh the worker's liveness key: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            self._beat()

    def stop(self) -> None:
        """Stop refreshing and delete the key (best effort)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=BEAT_S)  # no refresh after the delete
        try:
            self._redis.delete(self._key)
        except (redis.RedisError, OSError):
            pass  # it lapses on its own
