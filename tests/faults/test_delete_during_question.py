"""Finding 9: deleting a document while a question uses it leaves no orphan KV entries, and
the OpenAI-compatible stream ends with a finish or an error event, never silently cut.

Pages are prefilled at question time here (`CONDUIT_PREFILL_ON_INGEST=false`), so the delete
lands while the question computes their KV: before the fix those entries stayed on disk (and
in Redis, without TTL) with nothing to release them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.faults.conftest import Server, settled
from tests.pdfs import text_pdf


def _kv_entries(home: Path) -> list[Path]:
    return list((home / "kv").rglob("*.safetensors"))


def test_delete_during_a_streamed_question_leaves_no_orphan_kv(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory(CONDUIT_PREFILL_ON_INGEST="false")
    server.start()
    client = server.client()
    col = client.post("/v1/collections", json={"name": "c"}).json()["collection_id"]
    pages = [f"Page {i}: turbine blade inspection record number {i}." for i in range(8)]
    up = client.post(f"/v1/collections/{col}/documents",
                     files={"file": ("t.pdf", text_pdf(pages), "application/pdf")}).json()
    assert settled(client, up["document_id"])["status"] == "ready"
    assert _kv_entries(server.home) == []  # nothing prefilled yet

    lines: list[str] = []
    status: list[int] = []

    def ask() -> None:
        body = {"model": f"conduit:{col}", "stream": True, "top_k": 8, "max_tokens": 64,
                "messages": [{"role": "user", "content": "Which turbine blade record?"}]}
        with server.client(timeout=300).stream("POST", "/v1/chat/completions",
                                               json=body) as r:
            status.append(r.status_code)
            lines.extend(ln for ln in r.iter_lines() if ln.startswith("data: "))

    asker = threading.Thread(target=ask)
    asker.start()
    time.sleep(1.0)  # the question is retrieving / prefilling its pages
    assert client.delete(f"/v1/documents/{up['document_id']}").status_code == 204
    asker.join(timeout=300)
    assert not asker.is_alive()
    if status == [200]:  # the stream started: it ends with a finish or an error, then DONE
        assert lines[-1] == "data: [DONE]"
        last = json.loads(lines[-2].removeprefix("data: "))
        assert "error" in last or last["choices"][0]["finish_reason"] in ("stop", "length"), last
    else:  # deleted before the stream started: a clean refusal
        assert status and status[0] in (404, 409), status
    assert _kv_entries(server.home) == []  # no orphan KV entries
    assert not (server.home / "pages" / up["document_id"]).exists()
    assert client.get("/healthz").status_code == 200
