"""The distributed form over real parts: Redis (metadata, KV tier, Celery broker), a real
`conduit worker` Celery process, and a `conduit serve` process sharing one home volume."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from lab.processes import start_redis
from tests.pdfs import text_pdf
from tests.service.conftest import start_server, wait_ready


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(API URL, Redis URL) of a server + Celery worker pair on a fresh Redis."""
    tmp = tmp_path_factory.mktemp("cluster")
    redis_url, stop_redis = start_redis(tmp)
    home = tmp / "home"
    home.mkdir()
    env = {"CONDUIT_REDIS_URL": redis_url}
    worker_log = open(home / "worker.log", "wb")  # noqa: SIM115 - closed below
    worker = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "worker"],
        env={**os.environ, **env, "CONDUIT_HOME": str(home), "HF_HUB_OFFLINE": "1"},
        stdout=worker_log, stderr=subprocess.STDOUT,
    )
    url, api = start_server(home, env)
    try:
        yield url, redis_url, home
    finally:
        for proc in (api, worker):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        worker_log.close()
        stop_redis()


def test_celery_worker_ingests_and_api_answers(cluster: tuple[str, str, Path]) -> None:
    url, redis_url, home = cluster
    client = httpx.Client(base_url=url, timeout=300)
    col = client.post("/v1/collections", json={"name": "fleet"}).json()["collection_id"]
    pages = ["Engine maintenance schedule: replace the oil filter every 500 hours.",
             "Cabin crew roster for the winter season and holiday rotations."]
    r = client.post(f"/v1/collections/{col}/documents",
                    files={"file": ("fleet.pdf", text_pdf(pages), "application/pdf")})
    assert r.status_code == 202, r.text
    doc = wait_ready(client, r.json()["document_id"])
    assert doc["status"] == "ready", doc
    assert client.get(f"/v1/jobs/{r.json()['job_id']}").json()["status"] == "succeeded"
    out = client.post("/v1/query", json={"collection_id": col, "top_k": 1, "max_new_tokens": 4,
                                         "question": "When is the oil filter replaced?"})
    assert out.status_code == 200, out.text
    assert out.json()["citations"][0]["page"] == 1
    # the worker answered: the API process never loaded the model
    assert client.get("/v1/info").json()["model_loaded"] is False
    with client.stream("POST", "/v1/query/stream", json={
            "collection_id": col, "top_k": 1, "max_new_tokens": 3,
            "question": "Who is on the winter roster?"}) as s:
        events = [ln.removeprefix("event: ") for ln in s.iter_lines() if ln.startswith("event: ")]
    assert events[-1] == "done" and "token" in events
    # a refusal that only the worker can make (it knows the model depth) comes back as a 422
    bad = client.post("/v1/query", json={"collection_id": col, "question": "oil?",
                                         "score_layers": [7, 9]})
    assert bad.status_code == 422 and "layer" in bad.json()["detail"]
    # metadata and page KV live in Redis, not in a local SQLite file
    keys = redis.Redis.from_url(redis_url).keys("*")
    assert keys, "nothing was written to Redis"
    assert (home / "uploads").is_dir()  # the shared home volume is this one
    assert not (home / "metadata.sqlite3").exists()


def test_a_conversation_through_the_celery_worker(cluster: tuple[str, str, Path]) -> None:
    """A follow-up's earlier turns travel to the worker as JSON; the worker that answered the
    turn before holds its KV (a hit); the conversation is stored in Redis."""
    url, redis_url, home = cluster
    client = httpx.Client(base_url=url, timeout=300)
    col = client.post("/v1/collections", json={"name": "hangar"}).json()["collection_id"]
    r = client.post(f"/v1/collections/{col}/documents", files={"file": ("hangar.pdf", text_pdf(
        ["Hangar log. The left landing gear was serviced in May.",
         "Canteen menu. Soup on Mondays, fish on Fridays."]), "application/pdf")})
    assert wait_ready(client, r.json()["document_id"])["status"] == "ready"
    conv = client.post("/v1/conversations", json={"collection_id": col}).json()
    path = f"/v1/conversations/{conv['conversation_id']}/messages"
    first = client.post(path, json={"question": "When was the landing gear serviced?",
                                    "top_k": 1, "max_new_tokens": 4})
    assert first.status_code == 200, first.text
    second = client.post(path, json={"question": "Say more about it.", "top_k": 1,
                                     "max_new_tokens": 4}).json()
    assert second["cache"]["conversation"] == "hit"
    assert second["citations"][0]["filename"] == "hangar.pdf"
    assert second["citations"][0]["page"] == 1
    stored = redis.Redis.from_url(redis_url).keys("*conv:*")
    assert stored and not (home / "conversations.sqlite3").exists()
