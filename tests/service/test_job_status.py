"""A job's status as its document shows it (the document's status is written first)."""

from __future__ import annotations

from storage.metadata import CollectionId, Document, DocumentId, Job, JobId
from worker.recovery import settled_job


def _doc(status: str, job_id: str = "job_1", error: str | None = None) -> Document:
    return Document(id=DocumentId("doc_1"), collection_id=CollectionId("col_1"),
                    filename="a.pdf", sha256="0" * 64, size_bytes=1,
                    status=status, job_id=JobId(job_id), error=error)  # type: ignore[arg-type]


def _job(status: str) -> Job:
    return Job(id=JobId("job_1"), kind="ingest", status=status,  # type: ignore[arg-type]
               document_id=DocumentId("doc_1"))


def test_a_ready_document_settles_its_running_job() -> None:
    assert settled_job(_job("running"), _doc("ready")).status == "succeeded"
    assert settled_job(_job("queued"), _doc("ready")).status == "succeeded"


def test_a_failed_document_fails_its_job_with_the_documents_message() -> None:
    job = settled_job(_job("running"), _doc("failed", error="not a PDF"))
    assert (job.status, job.error) == ("failed", "not a PDF")


def test_an_unfinished_document_or_another_jobs_document_changes_nothing() -> None:
    assert settled_job(_job("running"), _doc("processing")).status == "running"
    assert settled_job(_job("running"), _doc("ready", job_id="job_2")).status == "running"
    assert settled_job(_job("failed"), _doc("ready")).status == "failed"
