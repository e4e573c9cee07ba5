"""Mapping of storage records to response schemas."""

from __future__ import annotations

from service.schemas import (
    CitationOut,
    CollectionOut,
    DocumentOut,
    JobOut,
    SkippedPageOut,
    SnippetOut,
)
from storage.metadata import Collection, Document, Job
from worker.facade import Citation


def collection_out(c: Collection) -> CollectionOut:
    """Response body of a collection."""
    return CollectionOut(collection_id=c.id, name=c.name, shared=c.shared,
                         created_at=c.created_at)


def document_out(d: Document) -> DocumentOut:
    """Response body of a document."""
    return DocumentOut(
        document_id=d.id, collection_id=d.collection_id, filename=d.filename, sha256=d.sha256,
        size_bytes=d.size_bytes, status=d.status, stage=d.stage, pages_done=d.pages_done,
        pages_total=d.pages_total, error=d.error, job_id=d.job_id,
        skipped_pages=[SkippedPageOut(page=p.number, reason=p.reason) for p in d.skipped_pages],
        warning=skipped_pages_warning(d),
    )


def skipped_pages_warning(d: Document) -> str | None:
    """"3 of 14 pages could not be read and were left out: 3, 9, 12." (None: all were read)."""
    if not d.skipped_pages:
        return None
    numbers = ", ".join(str(p.number) for p in d.skipped_pages)
    return (f"{len(d.skipped_pages)} of {d.pages_total} pages could not be read and were "
            f"left out: {numbers}.")


def job_out(j: Job) -> JobOut:
    """Response body of a job."""
    return JobOut(job_id=j.id, kind=j.kind, status=j.status, document_id=j.document_id,
                  error=j.error)


def citation_out(c: Citation) -> CitationOut:
    """Response body of a citation, with its snippet."""
    snip = c.snippet
    return CitationOut(
        document_id=c.document_id, filename=c.filename, page=c.page, score=c.score,
        attention=c.attention,
        snippet=None if snip is None else SnippetOut(
            text=snip.text, spans=list(snip.spans), clipped_left=snip.clipped_left,
            clipped_right=snip.clipped_right),
    )
