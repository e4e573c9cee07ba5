"""`conduit-lab demo`: the whole product on the trained testbed model, over real HTTP.

Starts the embedded service on `builtin:testbed-qwen2-vl` (in a throwaway home, on a free
loopback port) unless one serving that model already answers at `--url`, generates a small
set of testbed PDFs, uploads them through the REST API, waits for ingestion, and asks one
question of each of the five families per document with the service's default policy
(`conduit_adaptive`), with full reuse (nothing refreshed) and with full prefill, printing the
answer, the expected answer, the cited pages, TTFT and the language-model FLOPs against a
full prefill side by side. The service runs with its own defaults: at 256 visual tokens a
page, the default policy at the demo's budget is predicted (and measured) below a quarter of
a full prefill's FLOPs, so it runs on its own path and never falls back to a full prefill.
Each question is asked over `TOP_K` retrieved pages of its document, the most a training
question was shown: retrieval cannot rank pages for a one-letter key (BM25 reads words of two
or more characters), so in a 7- or 8-page document an evidence page can be missing (the cited
pages say which were read).

Public API:
  run_demo(url=None, n_docs=2, seed=5, budget=0.1, out=print) -> list[dict]
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

import lab.ablations  # noqa: F401 (registers the lab's policies by name)
from lab.testbed.generate import generate
from lab.testbed.task import FAMILIES
from worker.settings import CoreSettings

MODEL = "builtin:testbed-qwen2-vl"
DEFAULT_POLICY = str(CoreSettings.model_fields["policy"].default)  # the service's default
POLICIES = (DEFAULT_POLICY, "full_reuse", "full_prefill")
TOP_K = 6  # pages per question: a training question showed 4-6 (`Shape.shown`)


def _serves_testbed(url: str) -> bool:
    try:
        info = httpx.get(f"{url}/v1/info", timeout=2.0)
    except httpx.HTTPError:
        return False
    return info.status_code == 200 and info.json().get("model") == MODEL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _service(url: str | None, home: Path) -> Iterator[str]:
    """A service on the testbed model: the one at `url`, or one started now."""
    if url and _serves_testbed(url):
        yield url
        return
    port = _free_port()
    env = dict(os.environ, CONDUIT_MODEL=MODEL, CONDUIT_HOME=str(home / "home"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("CONDUIT_REDIS_URL", None)
    log = (home / "service.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    started = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _serves_testbed(started):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the service did not start; see {home / 'service.log'}")
            time.sleep(0.5)
        yield started
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _upload_all(client: httpx.Client, pdfs: list[Path]) -> tuple[str, dict[str, str]]:
    col = client.post("/v1/collections", json={"name": f"testbed-demo-{os.getpid()}"})
    col.raise_for_status()
    col_id = col.json()["collection_id"]
    ids = {}
    for pdf in pdfs:
        r = client.post(f"/v1/collections/{col_id}/documents",
                        files={"file": (pdf.name, pdf.read_bytes(), "application/pdf")})
        r.raise_for_status()
        ids[pdf.name] = r.json()["document_id"]
    for name, doc_id in ids.items():
        while (doc := client.get(f"/v1/documents/{doc_id}").json())["status"] != "ready":
            if doc["status"] == "failed":
                raise RuntimeError(f"{name}: {doc.get('error')}")
            time.sleep(0.3)
    return col_id, ids


def _cited(citations: list[dict[str, Any]]) -> str:
    """Cited pages, the page the question looked at most first, with its `attention`."""
    ranked = sorted(citations, key=lambda c: -(c.get("attention") or 0.0))
    return ", ".join(f"{c['filename']} p.{c['page']}" + (
        "" if c.get("attention") is None else f" {100 * c['attention']:.0f}%") for c in ranked)


def run_demo(url: str | None = None, n_docs: int = 2, seed: int = 5, budget: float = 0.1,
             out: Callable[[str], None] = print) -> list[dict[str, object]]:
    """Run the demo (see the module docstring); returns one row per question and policy."""
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="conduit-demo-") as tmp:
        work = Path(tmp)
        questions = generate(work / "set", len(FAMILIES) * n_docs, seed)
        with _service(url, work) as base, httpx.Client(base_url=base, timeout=300) as client:
            out(f"service: {base} (model {MODEL})")
            col_id, doc_ids = _upload_all(client, sorted((work / "set" / "pdfs").glob("*.pdf")))
            out(f"uploaded and ingested {len(doc_ids)} PDFs into collection {col_id}\n")
            out(f"{'family':<10} {'question':<17} {'want':>4} | " + " | ".join(
                f"{p[:10]:<10} {'ttft ms':>7} {'FLOPs':>5}" for p in POLICIES)
                + f" | cited by {POLICIES[0]}, most looked-at first")
            for q in questions:
                cells, cited = [], ""
                for policy in POLICIES:
                    body = {"collection_id": col_id, "question": q["question"], "top_k": TOP_K,
                            "max_new_tokens": 4, "policy": policy, "budget": budget,
                            "document_ids": [doc_ids[str(q["doc"])]]}
                    r = client.post("/v1/query", json=body)
                    r.raise_for_status()
                    a = r.json()
                    text = a["answer"].strip()
                    rows.append({"id": q["id"], "family": q["family"], "policy": policy,
                                 "answer": text, "expected": q["answer"],
                                 "correct": text == q["answer"],
                                 "ttft_ms": 1000 * a["timings"]["ttft_s"],
                                 "flops_ratio_lm": a["flops_ratio_lm"]})
                    mark = "ok" if text == q["answer"] else "x"
                    cells.append(f"{text[:4]:<4} {mark:<5} {1000 * a['timings']['ttft_s']:>7.1f} "
                                 f"{a['flops_ratio_lm']:>5.2f}")
                    if policy == POLICIES[0]:  # the default's answer: it scored the pages
                        cited = _cited(a["citations"])
                out(f"{q['family']:<10} {q['question']:<17} {q['answer']:>4} | "
                    + " | ".join(cells) + f" | {cited}")
    for policy in POLICIES:
        mine = [r for r in rows if r["policy"] == policy]
        out(f"{policy}: {sum(bool(r['correct']) for r in mine)}/{len(mine)} correct")
    return rows
