"""A Redis outage in the distributed form: clean 503s, the server survives, and it recovers."""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import urlparse

import httpx

from lab.processes import start_redis
from tests.pdfs import text_pdf
from tests.service.conftest import start_server


def test_redis_down_is_503_then_recovers(tmp_path: Path) -> None:
    redis_url, stop_redis = start_redis(tmp_path)
    port = urlparse(redis_url).port
    home = tmp_path / "home"
    home.mkdir()
    url, api = start_server(home, {"CONDUIT_REDIS_URL": redis_url})
    try:
        client = httpx.Client(base_url=url, timeout=120)
        col = client.post("/v1/collections", json={"name": "a"}).json()["collection_id"]
        stop_redis()
        r = client.get("/v1/collections")
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert "unavailable" in r.json()["detail"]
        # an upload: refused with 503, nothing kept
        r = client.post(f"/v1/collections/{col}/documents",
                        files={"file": ("a.pdf", text_pdf(["Valve 7 is inspected weekly."]),
                                        "application/pdf")})
        assert r.status_code == 503 and "unavailable" in r.json()["detail"], r.text
        assert not list((home / "uploads").glob("*.pdf"))
        assert client.get("/healthz").status_code == 200  # the process is alive
        _, stop_redis = start_redis(tmp_path, port=port)
        assert client.get("/v1/collections").status_code == 200
        assert client.post("/v1/collections", json={"name": "b"}).status_code == 201
    finally:
        api.terminate()
        try:
            api.wait(timeout=20)
        except subprocess.TimeoutExpired:
            api.kill()
        stop_redis()
