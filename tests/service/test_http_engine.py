"""The answer engine behind real HTTP (embedded `conduit serve`): concurrent streamed questions
are answered together, the answer's timings carry `queue_s`, the engine's series are on
/metrics, and a client that drops its stream takes its answer out of the batch."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.pdfs import text_pdf
from tests.service.conftest import start_server, stop_server, wait_ready

PAGES = ["Pump maintenance: the seals are replaced every spring.",
         "Invoice ledger: freight costs rose in the third quarter.",
         "Reactor audit: the pressure gauge reads within limits."]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, str]]:
    home = tmp_path_factory.mktemp("conduit-home")
    url, proc = start_server(home, {"CONDUIT_MAX_ACTIVE_ANSWERS": "4"})
    client = httpx.Client(base_url=url, timeout=300)
    try:
        col = client.post("/v1/collections", json={"name": "engine"}).json()["collection_id"]
        r = client.post(f"/v1/collections/{col}/documents",
                        files={"file": ("ops.pdf", text_pdf(PAGES), "application/pdf")})
        assert wait_ready(client, r.json()["document_id"])["status"] == "ready"
        yield client, str(col)
    finally:
        client.close()
        stop_server(proc)


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_concurrent_streams_are_batched(served: tuple[httpx.Client, str]) -> None:
    client, col = served
    results: list[dict | None] = [None] * 6

    def ask(i: int) -> None:
        body = {"collection_id": col, "question": f"What about the pump? ({i})", "top_k": 2,
                "max_new_tokens": 24}
        r = client.post("/v1/query", json=body)
        results[i] = r.json() if r.status_code == 200 else {"error": r.text}
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for out in results:
        assert out is not None and "error" not in out, out
        assert out["timings"]["queue_s"] >= 0
    metrics = client.get("/metrics").text
    steps = _metric(metrics, "conduit_engine_batch_size_count")
    advanced = _metric(metrics, "conduit_engine_batch_size_sum")
    assert 0 < steps < advanced  # answers shared decode steps
    assert "conduit_engine_queue_seconds_bucket" in metrics
    assert "conduit_engine_queue_length" in metrics


@pytest.mark.parametrize("route", ["/v1/query/stream", "/v1/chat/completions"])
def test_a_dropped_stream_leaves_the_batch(served: tuple[httpx.Client, str],
                                           route: str) -> None:
    client, col = served
    before = _metric(client.get("/metrics").text, "conduit_engine_cancelled_total")
    question = "Tell me everything about the reactor audit."
    body: dict[str, object] = {"collection_id": col, "question": question, "top_k": 3,
                               "max_new_tokens": 2048}
    if route.startswith("/v1/chat"):
        body = {"model": f"conduit:{col}", "max_tokens": 2048, "stream": True,
                "messages": [{"role": "user", "content": question}]}
    ended_by_itself = False
    with httpx.Client(base_url=str(client.base_url), timeout=60) as own, \
            own.stream("POST", route, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if "event: done" in line or "[DONE]" in line or '"finish_reason": "' in line:
                ended_by_itself = True
                break
            if line.startswith("event: token") or '"content"' in line:
                break  # the first piece of the answer: hang up
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = client.get("/metrics").text
        if _metric(metrics, "conduit_engine_active_answers") == 0:
            break
        time.sleep(0.1)
    assert _metric(metrics, "conduit_engine_active_answers") == 0
    if not ended_by_itself:  # a stop token before the first piece would end it at once
        assert _metric(metrics, "conduit_engine_cancelled_total") == before + 1
