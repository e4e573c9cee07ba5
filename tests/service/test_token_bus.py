"""The worker's answer-message publisher against a real redis-server: per-channel order from
many threads, sends that never wait for Redis, channels nobody listens to marked gone, and an
unreachable Redis that loses messages without raising into the engine."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from lab.processes import free_port
from worker.token_bus import TokenBus, token_bus


@pytest.fixture
def bus(redis_url: str) -> Iterator[TokenBus]:
    b = TokenBus(redis_url)
    yield b
    b.close()


def _until(cond: object, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def _next(sub: redis.client.PubSub, timeout: float = 5.0) -> dict[str, object] | None:
    """The next published message (subscribe confirmations skipped), or None after
    `timeout`."""
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        message = sub.get_message(timeout=left)
        if message is not None:
            return message  # type: ignore[no-any-return]
    return None


def test_messages_of_each_channel_arrive_in_order(bus: TokenBus, redis_url: str) -> None:
    channels = [f"t:order:{i}" for i in range(4)]
    sub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    sub.subscribe(*channels)

    def answer(channel: str) -> None:
        for i in range(300):
            bus.send(channel, {"token": [i, str(i)]})
        assert bus.send(channel, {"done": 1}, wait=10)

    threads = [threading.Thread(target=answer, args=(c,)) for c in channels]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got: dict[str, list[object]] = {c: [] for c in channels}
    done = 0
    while done < len(channels):
        message = _next(sub)
        assert message is not None, "messages were lost"
        data = json.loads(message["data"])  # type: ignore[arg-type]
        channel = message["channel"].decode()  # type: ignore[attr-defined]
        if "done" in data:
            done += 1
        else:
            assert len(got[channel]) == data["token"][0]  # in order, none missing
            got[channel].append(data["token"][0])
    assert all(len(v) == 300 for v in got.values())
    assert all(bus.listening(c) for c in channels)
    sub.close()


def test_send_never_waits_for_redis(bus: TokenBus, redis_url: str) -> None:
    """While the server holds every client (CLIENT PAUSE), a send returns at once; a
    synchronous PUBLISH would wait out the pause. The message goes out after it."""
    admin = redis.Redis.from_url(redis_url)
    sub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    sub.subscribe("t:pause")
    assert bus.send("t:pause", {"warm": 1}, wait=5)
    admin.execute_command("CLIENT", "PAUSE", "800", "ALL")
    t0 = time.perf_counter()
    for i in range(50):
        bus.send("t:pause", {"token": [i, "x"]})
    sent_in = time.perf_counter() - t0
    assert sent_in < 0.3, f"send waited for Redis ({sent_in:.2f} s)"
    assert bus.send("t:pause", {"done": 1}, wait=10)  # published once the pause ends
    assert time.perf_counter() - t0 > 0.5
    seen = 0
    while (message := _next(sub, 2)) is not None:
        seen += 1
        if "done" in json.loads(message["data"]):  # type: ignore[arg-type]
            break
    assert seen == 52  # the warm-up, 50 tokens, done
    sub.close()
    admin.close()


def test_a_channel_nobody_listens_to_is_gone(bus: TokenBus) -> None:
    assert bus.listening("t:nobody")
    assert not bus.send("t:nobody", {"started": 1}, wait=5)  # reached no subscriber
    assert not bus.listening("t:nobody")
    bus.release("t:nobody")  # the answer is over: the channel is forgotten
    assert bus.listening("t:nobody")


def test_a_late_result_after_release_is_not_kept(bus: TokenBus, redis_url: str) -> None:
    bus.send("t:late", {"token": [0, "a"]})
    bus.release("t:late")
    assert bus.send("t:other", {"x": 1}, wait=5) is False  # everything before it is out
    bus.release("t:other")
    assert bus.listening("t:late")


def test_unreachable_redis_loses_messages_without_raising(tmp_path: Path) -> None:
    bus = TokenBus(f"redis://127.0.0.1:{free_port()}/0")
    try:
        bus.send("t:down", {"token": [0, "a"]})  # never raises into the caller
        assert not bus.send("t:down", {"done": 1}, wait=15)
        assert _until(lambda: not bus.listening("t:down"))
    finally:
        bus.close()


def test_one_bus_per_process_and_url(redis_url: str) -> None:
    assert token_bus(redis_url) is token_bus(redis_url)
    assert token_bus(redis_url) is not token_bus(redis_url + "?x=1")


def test_a_message_that_is_not_json_is_dropped_alone(bus: TokenBus, redis_url: str) -> None:
    sub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    sub.subscribe("t:json")
    assert not bus.send("t:json", {"token": [0, object()]}, wait=5)
    assert bus.send("t:json", {"done": 1}, wait=5)  # the publisher thread lives on
    message = _next(sub)
    assert message is not None and json.loads(message["data"]) == {"done": 1}  # type: ignore[arg-type]
    sub.close()
