"""API keys: no token is 401, each key is a tenant, and tenants cannot see each other."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.pdfs import text_pdf
from tests.service.conftest import start_server


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("auth-home")
    base, proc = start_server(home, {"CONDUIT_API_KEYS": json.dumps(["alpha-key", "beta-key"])})
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_keys_are_required_and_tenants_isolated(url: str) -> None:
    anon = httpx.Client(base_url=url, timeout=60)
    alpha = httpx.Client(base_url=url, timeout=60, headers={"Authorization": "Bearer alpha-key"})
    beta = httpx.Client(base_url=url, timeout=60, headers={"Authorization": "Bearer beta-key"})
    assert anon.get("/v1/collections").status_code == 401
    bad = anon.get("/v1/collections", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401 and bad.json()["detail"] == "invalid API key"
    assert anon.get("/healthz").status_code == 200  # probes stay open

    col = alpha.post("/v1/collections", json={"name": "private"}).json()["collection_id"]
    # the same name is free for the other tenant
    assert beta.post("/v1/collections", json={"name": "private"}).status_code == 201
    assert [c["collection_id"] for c in alpha.get("/v1/collections").json()] == [col]
    assert beta.get(f"/v1/collections/{col}").status_code == 404
    up = beta.post(f"/v1/collections/{col}/documents",
                   files={"file": ("x.pdf", text_pdf(["x"]), "application/pdf")})
    assert up.status_code == 404
    assert beta.post("/v1/query", json={"collection_id": col, "question": "x"}).status_code == 404
