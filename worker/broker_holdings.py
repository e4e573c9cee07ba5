"""Which jobs the Celery broker still holds, so that a lost message is noticed and sent again.

A task message is held while it waits in its queue's Redis list or while a worker has taken it
and not acknowledged it (kombu's `unacked` hash; tasks are acknowledged late). A message that a
worker popped from the list but never recorded as taken (the worker froze, then was killed) is
in neither: its job would stay queued forever, so the reaper sends a job that is queued, older
than a lease and not held here again. Tasks are sent with their job id as the task id, which
kombu keeps in each message's headers. A message still waiting in a queue can be taken back
(`withdraw`: a follow-up sent to one worker's own queue that this worker did not take in
time is sent to the shared queue instead). This reads kombu's Redis layout (its default key
names).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import redis

from storage.errors import UnavailableError

UNACKED_KEY = "unacked"  # kombu.transport.redis.Channel.unacked_key


def _task_id(payload: Any) -> str | None:
    """The task id of one kombu message payload, None for anything else."""
    headers = payload.get("headers") if isinstance(payload, dict) else None
    task_id = headers.get("id") if isinstance(headers, dict) else None
    return task_id if isinstance(task_id, str) else None


def held_task_ids(client: redis.Redis, queues: Iterable[str]) -> set[str]:
    """Task ids of every message waiting in `queues` or taken and not yet acknowledged.

    `UnavailableError` when Redis cannot be read (the caller then decides nothing)."""
    try:
        waiting: list[bytes] = []
        for queue in queues:
            waiting.extend(client.lrange(queue, 0, -1))  # type: ignore[arg-type]
        taken: list[bytes] = list(client.hvals(UNACKED_KEY))  # type: ignore[arg-type]
    except (redis.RedisError, OSError) as exc:
        raise UnavailableError(f"the broker is unavailable ({type(exc).__name__})") from exc
    ids: set[str] = set()
    for raw in waiting + taken:
        try:
            payload = json.loads(raw)
        except ValueError:
            continue  # not a kombu message: nothing of ours
        if isinstance(payload, list) and payload:  # unacked: [message, exchange, routing key]
            payload = payload[0]
        task_id = _task_id(payload)
        if task_id is not None:
            ids.add(task_id)
    return ids


def withdraw(client: redis.Redis, queue: str, task_id: str) -> bool:
    """Remove the message of `task_id` from `queue` if it still waits there; whether it did
    (False: a worker took it first, or it was never there). Atomic with the workers' pops:
    a message is removed here or taken by a worker, not both.

    `UnavailableError` when Redis cannot be read."""
    try:
        waiting: list[bytes] = list(client.lrange(queue, 0, -1))  # type: ignore[arg-type]
        for raw in waiting:
            try:
                payload = json.loads(raw)
            except ValueError:
                continue
            if _task_id(payload) == task_id:
                return bool(client.lrem(queue, 1, raw))  # type: ignore[arg-type]
    except (redis.RedisError, OSError) as exc:
        raise UnavailableError(f"the broker is unavailable ({type(exc).__name__})") from exc
    return False
