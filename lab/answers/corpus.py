"""Ingest the evaluated PDFs once, through the service's own pipeline, into an eval home.

Each document goes through the same steps as an upload: `check_upload`, `store_upload`, an
ingest job run by `execute_ingest_job` (render, text/OCR, embed, and page-KV prefill when
`prefill_on_ingest` is set). Documents already ready in the home under the same collection
(a kept `--work-dir`) are reused, so a resumed run does not ingest again.

Public API:
  EvalCorpus(collection_id, documents, failed, seconds)
  ingest_documents(ctx, pdfs_dir, names, collection, progress=True) -> EvalCorpus
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from storage.metadata import CollectionId, Document, DocumentId, Job, JobId, new_id
from worker.context import WorkerContext
from worker.ingest.errors import IngestError
from worker.runners import execute_ingest_job
from worker.uploads import check_upload, store_upload

log = logging.getLogger(__name__)
TENANT = "default"


@dataclass
class EvalCorpus:
    """The ingested documents by file name, and the files that could not be ingested."""

    collection_id: CollectionId
    documents: dict[str, Document] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def ingest_documents(ctx: WorkerContext, pdfs_dir: Path, names: Sequence[str],
                     collection: str, progress: bool = True) -> EvalCorpus:
    """Ingest `names` (files in `pdfs_dir`) into `collection`, reusing ready ones."""
    started = time.perf_counter()
    col = ctx.meta.find_collection(collection, TENANT) or \
        ctx.meta.create_collection(collection, TENANT)
    corpus = EvalCorpus(collection_id=col.id)
    ready = {d.filename: d for d in ctx.meta.list_documents(col.id) if d.status == "ready"}
    s = ctx.settings
    for name in tqdm(list(dict.fromkeys(names)), desc="ingest", unit="doc", disable=not progress):
        if name in ready:
            corpus.documents[name] = ready[name]
            continue
        try:
            data = (pdfs_dir / name).read_bytes()
            checked = check_upload(data, password=None, max_bytes=s.worker.max_upload_bytes,
                                   max_pages=s.worker.max_pages)
        except OSError as exc:
            corpus.failed[name] = f"cannot read: {exc.strerror or exc}"
            continue
        except IngestError as exc:
            corpus.failed[name] = exc.message
            continue
        doc_id, job_id = DocumentId(new_id("doc")), JobId(new_id("job"))
        store_upload(ctx.home, doc_id, checked.data)
        ctx.meta.add_job(Job(id=job_id, kind="ingest", document_id=doc_id))
        ctx.meta.add_document(Document(id=doc_id, collection_id=col.id, filename=name,
                                       sha256=checked.sha256, size_bytes=len(data),
                                       pages_total=checked.page_count, job_id=job_id))
        execute_ingest_job(ctx, job_id, doc_id)
        doc = ctx.meta.get_document(doc_id)
        if doc.status == "ready":
            corpus.documents[name] = doc
        else:
            corpus.failed[name] = doc.error or "ingest failed"
    for name, message in corpus.failed.items():
        log.warning("not ingested: %s: %s", name, message)
    corpus.seconds = time.perf_counter() - started
    return corpus
