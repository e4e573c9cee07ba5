"""`conduit-lab bench retrieval-scale`: question latency of the persistent retrieval index vs the
scan path over synthetic collections of 1k-100k pages, in SQLite and Redis.

Pages are written as the ingest job writes them (about 1,500 characters of Zipf-distributed
words, a document context line, one 384-d unit embedding as float32 bytes; 20 pages per
document). Per store and size the parent builds the collection and the index (build time per
page); then each path is measured in a fresh process (`lab.retrieval.scale_probe`): its
first question is the first question after a restart, then warm questions (p50), then
documents added one at a time (ready + index hook, timed per page) each followed by a
question (cold after insert), and the peak RSS above the process's baseline after imports
and the embedder's load. Both paths run in one invocation so their ratio is meaningful on a
shared machine.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from storage.metadata import (
    Document,
    DocumentId,
    MetadataStore,
    Page,
    RedisMetadataStore,
    SQLiteMetadataStore,
    new_id,
)
from storage.metadata.records import CollectionId
from worker.retrieval.embedder import EMBEDDING_DIM, embedding_to_bytes
from worker.retrieval.index import RetrievalIndexes

PAGES_PER_DOC = 20
VOCABULARY = 40_000
_SYLLABLES = ["ka", "lo", "mi", "ter", "va", "sun", "dre", "pol", "qui", "ba", "nor", "est",
              "fi", "gar", "ul", "zen", "tro", "me", "sal", "vek", "or", "pin", "ha", "cul"]


def vocabulary(seed: int = 0) -> list[str]:
    """`VOCABULARY` distinct pseudo-words of 2-4 syllables."""
    rng = np.random.default_rng(seed)
    words: dict[str, None] = {}
    while len(words) < VOCABULARY:
        n = int(rng.integers(2, 5))
        words["".join(_SYLLABLES[i] for i in rng.integers(0, len(_SYLLABLES), n))] = None
    return list(words)


class PageMaker:
    """Synthetic pages (Zipf word frequencies) and unit embeddings."""

    def __init__(self, seed: int) -> None:
        self.words = np.array(vocabulary())
        weights = 1.0 / np.arange(1, VOCABULARY + 1) ** 1.05
        self.p = weights / weights.sum()
        self.rng = np.random.default_rng(seed)

    def document(self, collection: int) -> tuple[str, list[Page]]:
        """A new document id and its pages."""
        doc_id = new_id("doc")
        context = " ".join(self.words[self.rng.integers(0, 2000, 5)])
        idx = self.rng.choice(VOCABULARY, size=(PAGES_PER_DOC, 215), p=self.p)
        vectors = self.rng.normal(size=(PAGES_PER_DOC, EMBEDDING_DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        pages = [Page(document_id=DocumentId(doc_id), number=n + 1, page_hash=new_id("h"),
                      text=" ".join(self.words[idx[n]]), text_source="text_layer",
                      image_path=f"pages/{doc_id}/{n + 1:05d}.png", width=800, height=1100,
                      embedding=embedding_to_bytes(vectors[n:n + 1]), context=context)
                 for n in range(PAGES_PER_DOC)]
        return doc_id, pages

    def question(self, page: Page) -> str:
        """Five words of a page, rarer ones preferred, as a question."""
        words = list(dict.fromkeys(page.text.split()))
        words.sort(key=lambda w: len(w), reverse=True)
        picks = self.rng.choice(min(len(words), 40), size=5, replace=False)
        return "what about " + " ".join(words[int(i)] for i in picks)


def add_ready_document(meta: MetadataStore, collection_id: str, doc_id: str,
                       pages: list[Page]) -> None:
    """Store a ready document, as the ingest job does (record, pages, ready)."""
    meta.add_document(Document(id=DocumentId(doc_id), collection_id=CollectionId(collection_id),
                               filename=f"{doc_id}.pdf", sha256=doc_id, size_bytes=1))
    meta.put_pages(DocumentId(doc_id), pages)
    meta.update_progress(DocumentId(doc_id), status="ready", stage="done",
                         pages_done=len(pages), pages_total=len(pages))


def _open(store: str, home: Path, redis_url: str | None, prefix: str) -> MetadataStore:
    if store == "sqlite":
        return SQLiteMetadataStore(home / "metadata.sqlite3")
    assert redis_url is not None
    return RedisMetadataStore(redis_url, prefix=prefix)


def _folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def _probe(args: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path.cwd())}
    out = subprocess.run([sys.executable, "-m", "lab.retrieval.scale_probe", json.dumps(args)],
                         capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"probe failed: {out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run_retrieval_scale(*, pages: list[int], stores: list[str], questions: int, inserts: int,
                        work: Path | None, out: Path, command: str = "",
                        scan_max_pages: int = 100_000) -> dict[str, Any]:
    """Run the benchmark and write `{"rows": [...], ...}` to `out` (and a plot beside it)."""
    from lab.processes import start_redis

    scratch = Path(tempfile.mkdtemp(prefix="retrieval-scale-", dir=work))
    stop = None
    redis_url = None
    if "redis" in stores:
        redis_url, stop = start_redis(scratch / "redis")
    rows: list[dict[str, Any]] = []
    try:
        for store in stores:
            for n in pages:
                rows += _one(store, n, scratch, redis_url, questions, inserts, scan_max_pages)
                _write(out, rows, command)
    finally:
        if stop:
            stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return _write(out, rows, command)


def _one(store: str, n: int, scratch: Path, redis_url: str | None, questions: int,
         inserts: int, scan_max_pages: int) -> list[dict[str, Any]]:
    home = scratch / f"{store}-{n}"
    home.mkdir(parents=True)
    prefix = f"bench{n}"
    meta = _open(store, home, redis_url, prefix)
    collection = meta.create_collection("bench", "tenant")
    maker = PageMaker(seed=n)
    t0 = time.perf_counter()
    sample: list[Page] = []
    for d in range(max(n // PAGES_PER_DOC, 1)):
        doc_id, doc_pages = maker.document(d)
        add_ready_document(meta, collection.id, doc_id, doc_pages)
        if d % max(n // PAGES_PER_DOC // (questions + 1), 1) == 0:
            sample.append(doc_pages[d % PAGES_PER_DOC])
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    indexed = RetrievalIndexes(home / "index").rebuild(meta, collection.id)
    build_ms = 1000 * (time.perf_counter() - t0) / max(indexed, 1)
    meta.close()
    qs = [maker.question(p) for p in sample][:questions]
    print(f"{store} {n}: stored in {write_s:.0f} s, index built at {build_ms:.2f} ms/page",
          flush=True)
    out = []
    for path in ("index", "scan"):
        if path == "scan" and n > scan_max_pages:
            continue
        # the scan path pays seconds per question at 10k pages: fewer of them there
        light = path == "scan" and n >= 5000
        probe = _probe({"store": store, "home": str(home), "redis_url": redis_url,
                        "prefix": prefix, "collection": collection.id, "path": path,
                        "questions": qs[:min(questions, 6)] if light else qs,
                        "inserts": min(inserts, 1) if light else inserts, "seed": n + 1})
        row = {"store": store, "pages": n, "path": path, **probe,
               "index_mb": round(_folder_mb(home / "index"), 1) if path == "index" else 0.0,
               "build_ms_per_page": round(build_ms, 3) if path == "index" else None}
        print(json.dumps(row), flush=True)
        out.append(row)
    shutil.rmtree(home, ignore_errors=True)
    if store == "redis" and redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(f"{prefix}:*", count=10_000):
            client.delete(key)
    return out


def _write(out: Path, rows: list[dict[str, Any]], command: str) -> dict[str, Any]:
    summary = {"command": command, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
               "pages_per_document": PAGES_PER_DOC, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    if rows:
        plot(rows, out.with_suffix(".png"))
    return summary


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Warm p50, cold-after-insert and restart latency against collection size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("warm_p50_ms", "warm p50"), ("cold_after_insert_ms", "first after insert"),
               ("restart_first_ms", "first after restart")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, (key, title) in zip(axes, metrics, strict=True):
        for store in sorted({r["store"] for r in rows}):
            for kind, style in (("index", "-o"), ("scan", "--s")):
                sel = sorted((r for r in rows if r["store"] == store and r["path"] == kind),
                             key=lambda r: r["pages"])
                if sel:
                    ax.plot([r["pages"] for r in sel], [r[key] for r in sel], style,
                            label=f"{kind} ({store})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("pages in the collection")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
