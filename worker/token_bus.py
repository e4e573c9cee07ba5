"""Answer messages from a worker process to the API, published off the engine's thread.

The answer engine calls each question's token callback from its one model thread, once per
token of every answer in the batch. A Redis `PUBLISH` there waits for its reply (how many
listen), so a batch of 16 answers waited for 16 round trips per decode step, on a busy
machine as long as the step's model work. `TokenBus` (one per worker process and Redis URL,
made on first use) takes every answer's messages into one FIFO, and a publisher thread sends
whatever has gathered in one pipeline (one round trip) while the engine runs its next step;
messages of one channel keep their order.

A publish that reached nobody (the API stopped listening: its client went away, or it gave
the question up) marks its channel gone; the answer's next token callback sees it and leaves
the batch (one step later than a synchronous publish would tell it). A pipeline that fails
(Redis unreachable after the client's own retries) marks its channels gone too: nobody can
receive them. A send may wait until its message is out (an answer's last message, before its
task returns and is acknowledged). A question delivered twice (sent again after its message
seemed lost) is answered once: the worker that claims its channel first answers it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)

PIPELINE_MAX = 512  # messages sent in one round trip at most
CLAIM_PREFIX = "conduit:answer-claim:"  # + channel: the worker answering that question


@dataclass
class _Message:
    channel: str
    body: dict[str, Any]
    sent: threading.Event | None = None  # set once published (or failed), for `wait`
    ok: bool = field(default=False)


class TokenBus:
    """One worker process's publisher of answer messages (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(
            url, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
            socket_connect_timeout=2.0, socket_timeout=10.0)
        self._cond = threading.Condition()
        self._pending: deque[_Message] = deque()
        self._open: set[str] = set()  # channels with an answer in progress
        self._gone: set[str] = set()  # of those, the ones nobody listens to any more
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="conduit-token-bus", daemon=True)
        self._thread.start()

    def send(self, channel: str, message: dict[str, Any], wait: float | None = None) -> bool:
        """Queue `message` (a JSON object) for `channel`. With `wait`, block up to that many
        seconds until it is published; returns whether it was (without `wait`: True)."""
        item = _Message(channel, message, threading.Event() if wait is not None else None)
        with self._cond:
            if self._closed:
                return False
            self._pending.append(item)
            self._open.add(channel)
            self._cond.notify()
        if item.sent is None:
            return True
        return item.sent.wait(wait) and item.ok

    def claim(self, channel: str, ttl_s: float) -> bool:
        """Take the answer on `channel` for this worker: False when another delivery of the
        same question already took it (a question sent again after its message seemed lost
        is answered once). The claim lapses after `ttl_s`, or when the API drops it."""
        key = CLAIM_PREFIX + channel
        return bool(self._redis.set(key, "1", nx=True, ex=max(1, int(ttl_s))))

    def listening(self, channel: str) -> bool:
        """False once a message to `channel` reached nobody (or could not be sent)."""
        return channel not in self._gone

    def release(self, channel: str) -> None:
        """Forget `channel`: its answer is over (call it after its last `send`)."""
        with self._cond:
            self._open.discard(channel)
            self._gone.discard(channel)

    def close(self) -> None:
        """Publish what is queued, then stop the publisher thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)
        self._redis.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._pending or self._closed):
                    self._cond.wait()
                if not self._pending:
                    return
                batch = [self._pending.popleft()
                         for _ in range(min(PIPELINE_MAX, len(self._pending)))]
            counts = self._publish(batch)
            with self._cond:
                for item, count in zip(batch, counts, strict=True):
                    if count == 0 and item.channel in self._open:
                        self._gone.add(item.channel)
            for item, count in zip(batch, counts, strict=True):
                item.ok = count > 0
                if item.sent is not None:
                    item.sent.set()

    def _publish(self, batch: list[_Message]) -> list[int]:
        """Receivers of each message of `batch` (0 for one that is not JSON, and for all
        when Redis failed)."""
        counts = [0] * len(batch)
        sent: list[int] = []  # places in `batch` of the messages in the pipeline
        try:
            pipe = self._redis.pipeline(transaction=False)
            for i, item in enumerate(batch):
                try:
                    payload = json.dumps(item.body)
                except (TypeError, ValueError) as exc:
                    log.error("answer message on %s is not JSON: %s", item.channel, exc)
                    continue
                pipe.publish(item.channel, payload)
                sent.append(i)
            for i, n in zip(sent, pipe.execute(), strict=True):
                counts[i] = int(n)
        except redis.RedisError as exc:
            log.warning("could not publish %d answer message(s): %s", len(batch), exc)
            return [0] * len(batch)
        return counts


_buses: dict[tuple[int, str], TokenBus] = {}
_buses_lock = threading.Lock()


def token_bus(url: str) -> TokenBus:
    """This process's `TokenBus` for the Redis at `url`, created on first use (and again in
    a forked child: a publisher thread does not survive a fork)."""
    key = (os.getpid(), url)
    with _buses_lock:
        if key not in _buses:
            _buses[key] = TokenBus(url)
        return _buses[key]
