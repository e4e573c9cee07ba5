"""An ingest job delivered again after an earlier attempt finished its document (the attempt
then lost its job record to a storage outage): the retry closes the job from the document
and leaves the document ready, never back to "processing". Real SQLite store and context."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storage.metadata import Document, DocumentId, Job, JobId
from worker.context import WorkerContext, build_context
from worker.runners import execute_ingest_job
from worker.settings import Settings


@pytest.fixture
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerContext]:
    context = build_context(Settings(home=tmp_path_factory.mktemp("ingest-retry"),
                                     model="builtin:tiny-qwen2-vl", memory_kv_bytes=0))
    yield context
    context.close()


def _finished_document(ctx: WorkerContext) -> tuple[DocumentId, JobId]:
    col = ctx.meta.create_collection("c", "default")
    doc_id, job_id = DocumentId("doc_retry"), JobId("job_retry")
    ctx.meta.add_document(Document(id=doc_id, collection_id=col.id, filename="a.pdf",
                                   sha256="0" * 64, size_bytes=1, job_id=job_id))
    ctx.meta.add_job(Job(id=job_id, kind="ingest", document_id=doc_id))
    ctx.meta.update_progress(doc_id, status="ready", stage="done", pages_done=3,
                             pages_total=3)  # the first attempt's last write
    return doc_id, job_id


def test_a_retry_of_a_finished_ingest_closes_its_job_and_keeps_the_document(
        ctx: WorkerContext) -> None:
    doc_id, job_id = _finished_document(ctx)
    execute_ingest_job(ctx, job_id, doc_id)  # would fail the document: it has no upload file
    doc = ctx.meta.get_document(doc_id)
    assert (doc.status, doc.pages_done) == ("ready", 3)
    assert ctx.meta.get_job(job_id).status == "succeeded"


def test_an_unfinished_document_is_still_ingested(ctx: WorkerContext) -> None:
    doc_id, job_id = _finished_document(ctx)
    ctx.meta.update_progress(doc_id, status="processing", stage="render", pages_done=0,
                             pages_total=3)
    execute_ingest_job(ctx, job_id, doc_id)  # runs: its upload is missing, so it fails
    assert ctx.meta.get_document(doc_id).status == "failed"
    assert ctx.meta.get_job(job_id).status == "failed"
