"""Issue 66, point 2, distributed form: a conversation's follow-ups go to the Celery worker
that keeps its prefix (`worker.conversation_routes`), and to another worker, which rebuilds
it, once that one is gone, without being stranded in the dead worker's own queue.

The first test is the routing decision and the take-back on real Redis with the real Celery
app sending (no worker needed: fast); the second runs two real `conduit worker` processes."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from lab.processes import start_redis, stop_processes
from storage.metadata import CollectionId
from tests.faults.conftest import FAST, settled, start_serve, start_worker, wait_for
from tests.pdfs import text_pdf
from worker.answer_job import Question
from worker.celery_app import ANSWER_QUEUE, CeleryRunner
from worker.conversation_routes import BEAT_TTL_S, Beacon, Routes, worker_queue
from worker.conversation_turns import PastTurn
from worker.errors import AnswerCancelledError
from worker.settings import Settings


def _question(text: str, history: tuple[PastTurn, ...] = (), tenant: str = "t1") -> Question:
    return Question(collection_id=CollectionId("col"), question=text, top_k=1,
                    max_new_tokens=4, tenant=tenant, history=history, keep=True)


def _waiting_in(client: redis.Redis, queue: str) -> int:
    return int(client.llen(queue))  # type: ignore[arg-type]


def test_a_follow_up_goes_to_its_live_holder_and_is_taken_back_when_it_dies(
        tmp_path: Path) -> None:
    redis_url, stop_redis = start_redis(tmp_path)
    client = redis.Redis.from_url(redis_url)
    runner = CeleryRunner(redis_url, Settings(job_lease_s=60.0, answer_queue_wait_s=60.0))
    try:
        routes = Routes(client)
        routes.record(_question("Where is the gear?"), "In the hangar.", "w1", ttl_s=600)
        # the REST form (pages named) and the OpenAI form (found again) give the same key
        rest = _question("And when?", (PastTurn("Where is the gear?", "In the hangar.",
                                                ("doc1:1",)),))
        chat = _question("And when?", (PastTurn("Where is the gear?", "In the hangar."),))
        assert routes.holder_for(chat) is None  # w1 has never said it is alive
        beacon = Beacon(client, "w1")
        beacon.start()
        assert routes.holder_for(rest) == routes.holder_for(chat) == "w1"
        assert routes.holder_for(_question("Where is the gear?")) is None  # a first turn
        other = _question(chat.question, chat.history, tenant="t2")
        assert routes.holder_for(other) is None  # another tenant's

        cancel = threading.Event()
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                runner.answer(chat, cancel=cancel)
            except AnswerCancelledError as exc:
                errors.append(exc)

        asking = threading.Thread(target=ask)
        asking.start()
        wait_for(lambda: _waiting_in(client, worker_queue("w1")) == 1, 10, "the routed send")
        assert _waiting_in(client, ANSWER_QUEUE) == 0
        time.sleep(2)  # its holder is alive: the message stays in its own queue
        assert _waiting_in(client, worker_queue("w1")) == 1
        beacon.stop()  # the holder stopped: the follow-up moves to the shared queue
        wait_for(lambda: _waiting_in(client, ANSWER_QUEUE) == 1, 10, "the take-back")
        assert _waiting_in(client, worker_queue("w1")) == 0
        cancel.set()
        asking.join(timeout=10)
        assert errors  # the waiting answer ended when cancelled
    finally:
        runner.shutdown()
        stop_redis()


def _worker_ready(log: Path) -> bool:
    return log.exists() and b" ready." in log.read_bytes()


def _answers(home: Path, log: str) -> int:
    """Answer tasks the worker logging to `log` has received."""
    return len(re.findall(rb"Task conduit\.answer\[[^\]]+\] received", (home / log).read_bytes()))


ANSWER_S = 30.0  # one rebuilt follow-up on the builtin model, on a shared 2-core machine


Cluster = tuple[httpx.Client, Path, dict[str, subprocess.Popen[bytes]]]


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[Cluster]:
    """(API client, home, worker processes by log name) of a server and two workers."""
    redis_url, stop_redis = start_redis(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    logs = ("worker1.log", "worker2.log")
    workers = {log: start_worker(home, redis_url, log) for log in logs}
    procs: list[subprocess.Popen[bytes]] = list(workers.values())
    try:
        # a lease longer than the bound: a follow-up is taken back because its holder's
        # liveness key lapsed, not because it waited a lease
        url, api = start_serve(home, {**FAST, "CONDUIT_REDIS_URL": redis_url,
                                      "CONDUIT_JOB_LEASE_S": "60"})
        procs.append(api)
        for log in logs:
            wait_for(lambda log=log: _worker_ready(home / log), 600, log)
        yield httpx.Client(base_url=url, timeout=300), home, workers
    finally:
        stop_processes(procs)
        stop_redis()


def test_follow_ups_go_to_the_worker_holding_the_conversation(two_workers: Cluster) -> None:
    client, home, workers = two_workers
    col = client.post("/v1/collections", json={"name": "hangar"}).json()["collection_id"]
    up = client.post(f"/v1/collections/{col}/documents", files={"file": ("hangar.pdf", text_pdf(
        ["Hangar log. The left landing gear was serviced in May.",
         "Canteen menu. Soup on Mondays, fish on Fridays."]), "application/pdf")}).json()
    assert settled(client, up["document_id"], timeout=600)["status"] == "ready"
    conv = client.post("/v1/conversations", json={"collection_id": col}).json()
    path = f"/v1/conversations/{conv['conversation_id']}/messages"
    ask = {"top_k": 1, "max_new_tokens": 4}

    def count() -> dict[str, int]:
        return {log: _answers(home, log) for log in workers}

    before = count()
    first = client.post(path, json={"question": "When was the landing gear serviced?", **ask})
    assert first.status_code == 200, first.text
    holder = next(log for log, n in count().items() if n > before[log])
    other = next(log for log in workers if log != holder)
    for question in ("Which gear was it?", "Say more about it."):
        out = client.post(path, json={"question": question, **ask}).json()
        assert out["cache"]["conversation"] == "hit", out
    after = count()
    assert after[holder] - before[holder] == 3  # every turn on the holder
    assert after[other] == before[other]

    # OpenAI chat: the messages sent back name the conversation, without any id
    messages = [{"role": "user", "content": "What is on the canteen menu on Fridays?"}]
    chat = client.post("/v1/chat/completions", json={
        "model": f"conduit:{col}", "messages": messages, "max_tokens": 4}).json()
    once = count()
    chat_holder = next(log for log, n in once.items() if n > after[log])
    messages += [{"role": "assistant", "content": chat["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "And on Mondays?"}]
    again = client.post("/v1/chat/completions", json={
        "model": f"conduit:{col}", "messages": messages, "max_tokens": 4}).json()
    assert again["conduit"]["conversation"] == "hit", again
    twice = count()
    assert twice[chat_holder] == once[chat_holder] + 1  # the follow-up on the same worker
    assert sum(twice.values()) == sum(once.values()) + 1

    # the holder killed: its next follow-up is not stranded in its queue
    workers[holder].send_signal(signal.SIGKILL)
    workers[holder].wait(timeout=30)
    left = count()
    started = time.monotonic()
    out = client.post(path, json={"question": "Who serviced it?", **ask})
    assert out.status_code == 200, out.text
    assert out.json()["cache"]["conversation"] == "rebuilt"
    assert time.monotonic() - started < BEAT_TTL_S + 2 + ANSWER_S
    assert count()[other] > left[other]
