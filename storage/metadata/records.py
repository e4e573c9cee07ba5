"""Typed records of the metadata store: collections, documents, pages and jobs."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, NewType

from storage.text_safety import printable_name, safe_value

CollectionId = NewType("CollectionId", str)
DocumentId = NewType("DocumentId", str)
JobId = NewType("JobId", str)

DocumentStatus = Literal["queued", "processing", "ready", "failed"]
JobStatus = Literal["queued", "running", "succeeded", "failed"]
IngestStage = Literal["queued", "render", "text", "index", "prefill", "done"]
TextSource = Literal["text_layer", "ocr", "none"]


def new_id(prefix: str) -> str:
    """A random id with a readable prefix, e.g. `doc_3f2a...`."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class Collection:
    """A named set of documents owned by a tenant."""

    id: CollectionId
    name: str
    tenant: str
    shared: bool = False
    created_at: float = field(default_factory=time.time)

    @property
    def page_namespace(self) -> str | None:
        """The namespace its pages are hashed and cached under (`storage.keys.page_hash`):
        its tenant's, or None for a shared corpus."""
        return None if self.shared else self.tenant


@dataclass(frozen=True)
class SkippedPage:
    """A page of a ready document that could not be read (damaged or missing), and why."""

    number: int  # 1-based
    reason: str


@dataclass
class Document:
    """One uploaded PDF and the progress of its ingestion."""

    id: DocumentId
    collection_id: CollectionId
    filename: str
    sha256: str
    size_bytes: int
    status: DocumentStatus = "queued"
    stage: IngestStage = "queued"
    pages_done: int = 0
    pages_total: int = 0
    error: str | None = None
    job_id: JobId | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    skipped_pages: list[SkippedPage] = field(default_factory=list)

    def __post_init__(self) -> None:
        # a file name is shown (API, web page, CLI): control and format characters escaped
        self.filename = printable_name(self.filename)
        # the stores hand back JSON text (SQLite) or decoded JSON (Redis)
        raw: Any = self.skipped_pages
        if isinstance(raw, str):
            raw = json.loads(raw)
        # JSON carries lone surrogates as escapes: reasons written before issue 30 are repaired
        self.skipped_pages = [p if isinstance(p, SkippedPage) else SkippedPage(**safe_value(p))
                              for p in raw]


@dataclass
class Page:
    """One page of a document: where its image lives, its text, and its KV page hash."""

    document_id: DocumentId
    number: int  # 1-based
    page_hash: str  # storage.keys.PageHash of the page's KV entry
    text: str
    text_source: TextSource
    image_path: str  # relative to the home dir
    width: int
    height: int
    embedding: bytes | None = None  # float32 dense embedding of the text (with `context`)
    context: str = ""  # title words of the page's document, indexed with every page


@dataclass
class Job:
    """A unit of background work (ingest or answer) and its outcome."""

    id: JobId
    kind: Literal["ingest", "answer"]
    status: JobStatus = "queued"
    document_id: DocumentId | None = None
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)  # the lease: a running job's heartbeat
    attempts: int = 0  # times a worker claimed the job (capped: see `claim_job`)
