"""SQLite metadata store for the embedded form: one file under the home dir, WAL mode.

A full disk: a write that fails for lack of space raises `DiskFullError` and leaves nothing.
Beside the database a reserve file of `RESERVE_BYTES` (`storage.space.SpaceReserve`) is kept;
deletes and status writes (`_may_release_reserve`) that find the disk full release it and
retry once, so a document can be deleted (and its space freed), and an ingest can record its
failure, on a full disk. Writes that add data (collections, documents, pages) do not use it.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from storage.errors import ConflictError, DiskFullError, NotFoundError
from storage.metadata.records import (
    Collection,
    CollectionId,
    Document,
    DocumentId,
    DocumentStatus,
    IngestStage,
    Job,
    JobId,
    JobStatus,
    Page,
    SkippedPage,
    new_id,
)
from storage.metadata.usage import Quota, Usage
from storage.space import SpaceReserve, is_disk_full
from storage.text_safety import safe_text, safe_value

# the reserve file beside the database: room for the write-ahead log of a delete or a status
# write on a full disk (SQLite checkpoints its log every 1000 pages of 4 KiB)
RESERVE_BYTES = 16 * 2**20

P = ParamSpec("P")
R = TypeVar("R")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, tenant TEXT NOT NULL, shared INTEGER NOT NULL,
    created_at REAL NOT NULL, UNIQUE (tenant, name));
CREATE TABLE IF NOT EXISTS documents (
    id TEXT PRIMARY KEY, collection_id TEXT NOT NULL REFERENCES collections(id),
    filename TEXT NOT NULL, sha256 TEXT NOT NULL, size_bytes INTEGER NOT NULL,
    status TEXT NOT NULL, stage TEXT NOT NULL, pages_done INTEGER NOT NULL,
    pages_total INTEGER NOT NULL, error TEXT, job_id TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS documents_by_collection ON documents (collection_id);
CREATE TABLE IF NOT EXISTS pages (
    document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    number INTEGER NOT NULL, page_hash TEXT NOT NULL, text TEXT NOT NULL,
    text_source TEXT NOT NULL, image_path TEXT NOT NULL, width INTEGER NOT NULL,
    height INTEGER NOT NULL, embedding BLOB, context TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (document_id, number));
CREATE INDEX IF NOT EXISTS pages_by_hash ON pages (page_hash);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, status TEXT NOT NULL, document_id TEXT,
    error TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status);
"""


# Columns added after the first release: (table, column, definition). A database written by
# an older version gains them on open; their defaults are what the older version meant.
_ADDED_COLUMNS = [("pages", "context", "TEXT NOT NULL DEFAULT ''"),
                  ("jobs", "attempts", "INTEGER NOT NULL DEFAULT 0"),
                  ("documents", "skipped_pages", "TEXT NOT NULL DEFAULT '[]'")]


def _migrate(conn: sqlite3.Connection) -> None:
    for table, column, definition in _ADDED_COLUMNS:
        present = {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")


def _row(cls: type, row: sqlite3.Row) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: row[k] for k in row.keys() if k in names})


def _may_release_reserve(method: Callable[P, R]) -> Callable[P, R]:
    """A write that must work on a full disk: on `DiskFullError` the store's reserve file is
    released and the write retried once; after a write, a released reserve is taken again
    when the disk has room for it."""
    @functools.wraps(method)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        store: SQLiteMetadataStore = args[0]  # type: ignore[assignment]
        try:
            result = method(*args, **kwargs)
        except DiskFullError:
            if not store._reserve.release():
                raise
            result = method(*args, **kwargs)
        store._reserve.take()
        return result
    return run


def _text(raw: bytes) -> str:
    """A TEXT value as valid UTF-8: bytes that do not decode (written by another tool, or
    encoded surrogates) read back as `\\xNN` escapes instead of failing the whole read."""
    return raw.decode("utf-8", "backslashreplace")


class SQLiteMetadataStore:
    """`MetadataStore` on one SQLite file; safe to share between threads of one process."""

    def __init__(self, path: Path, *, reserve_bytes: int = RESERVE_BYTES) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._reserve = SpaceReserve(path.with_name(path.name + ".reserve"), reserve_bytes)
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.text_factory = _text
        self._lock = threading.RLock()
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._conn.executescript(_SCHEMA)
            _migrate(self._conn)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; `DiskFullError` (nothing kept) when the disk is full."""
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:  # a failed COMMIT can leave it open
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:
                if is_disk_full(exc):
                    raise DiskFullError(f"the metadata database is out of disk space: {exc}"
                                        ) from exc
                raise

    def _insert(self, table: str, record: Any, conflict: str) -> None:
        """Insert a dataclass record as one row; `ConflictError(conflict)` on a duplicate."""
        values = {k: json.dumps(v) if isinstance(v, list) else v
                  for k, v in safe_value(asdict(record)).items()}
        cols, marks = ", ".join(values), ", ".join("?" for _ in values)
        try:
            with self._tx() as c:
                c.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})",
                          tuple(values.values()))
        except sqlite3.IntegrityError as exc:
            raise ConflictError(conflict) from exc

    def _one(self, sql: str, args: Sequence[Any]) -> sqlite3.Row | None:
        with self._lock:
            row: sqlite3.Row | None = self._conn.execute(sql, args).fetchone()
            return row

    def _all(self, sql: str, args: Sequence[Any]) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._conn.execute(sql, args).fetchall())

    # collections
    def create_collection(self, name: str, tenant: str, shared: bool = False) -> Collection:
        """Create a collection; `ConflictError` if the tenant already has one of that name."""
        name, tenant = safe_text(name), safe_text(tenant)
        col = Collection(id=CollectionId(new_id("col")), name=name, tenant=tenant, shared=shared)
        try:
            with self._tx() as c:
                c.execute(
                    "INSERT INTO collections VALUES (?, ?, ?, ?, ?)",
                    (col.id, col.name, col.tenant, int(col.shared), col.created_at),
                )
        except sqlite3.IntegrityError as exc:
            raise ConflictError(f"collection {name!r} already exists") from exc
        return col

    def get_collection(self, collection_id: CollectionId) -> Collection:
        """The collection, or `NotFoundError`."""
        row = self._one("SELECT * FROM collections WHERE id = ?", (collection_id,))
        if row is None:
            raise NotFoundError(f"collection {collection_id} not found")
        col: Collection = _row(Collection, row)
        col.shared = bool(col.shared)
        return col

    def find_collection(self, name: str, tenant: str) -> Collection | None:
        """The tenant's collection of that name, if any."""
        name, tenant = safe_text(name), safe_text(tenant)
        row = self._one("SELECT id FROM collections WHERE name = ? AND tenant = ?", (name, tenant))
        return None if row is None else self.get_collection(row["id"])

    def list_collections(self, tenant: str) -> list[Collection]:
        """The tenant's collections, oldest first."""
        rows = self._all(
            "SELECT id FROM collections WHERE tenant = ? ORDER BY created_at", (tenant,)
        )
        return [self.get_collection(r["id"]) for r in rows]

    @_may_release_reserve
    def delete_collection(self, collection_id: CollectionId) -> None:
        """Delete an empty collection (`ConflictError` if it still holds documents)."""
        with self._tx() as c:
            if c.execute("SELECT 1 FROM documents WHERE collection_id = ?",
                         (collection_id,)).fetchone():
                raise ConflictError(f"collection {collection_id} still holds documents")
            if c.execute("DELETE FROM collections WHERE id = ?", (collection_id,)).rowcount == 0:
                raise NotFoundError(f"collection {collection_id} not found")

    # documents
    def add_document(self, document: Document, quota: Quota | None = None) -> None:
        """Insert a new document record; with `quota`, only if its collection's tenant stays
        within it (`QuotaExceededError` otherwise), checked in the insert's transaction."""
        col = self.get_collection(document.collection_id)
        values = {k: json.dumps(v) if isinstance(v, list) else v
                  for k, v in safe_value(asdict(document)).items()}
        cols, marks = ", ".join(values), ", ".join("?" for _ in values)
        try:
            with self._tx() as c:
                if quota is not None:
                    quota.check(self._usage(c, col.tenant),
                                Usage(document.size_bytes, 1, document.pages_total))
                c.execute(f"INSERT INTO documents ({cols}) VALUES ({marks})",
                          tuple(values.values()))
        except sqlite3.IntegrityError as exc:
            raise ConflictError(f"document {document.id} already exists") from exc

    def usage(self, tenant: str) -> Usage:
        """What the tenant's documents take (`storage.metadata.usage`)."""
        with self._lock:
            return self._usage(self._conn, safe_text(tenant))

    @staticmethod
    def _usage(c: sqlite3.Connection, tenant: str) -> Usage:
        row = c.execute(
            "SELECT COALESCE(SUM(d.size_bytes), 0), COUNT(d.id), COALESCE(SUM(d.pages_total), 0)"
            " FROM documents d JOIN collections c ON c.id = d.collection_id WHERE c.tenant = ?",
            (tenant,)).fetchone()
        return Usage(int(row[0]), int(row[1]), int(row[2]))

    def get_document(self, document_id: DocumentId) -> Document:
        """The document, or `NotFoundError`."""
        row = self._one("SELECT * FROM documents WHERE id = ?", (document_id,))
        if row is None:
            raise NotFoundError(f"document {document_id} not found")
        doc: Document = _row(Document, row)
        return doc

    def list_documents(self, collection_id: CollectionId) -> list[Document]:
        """Documents of a collection, oldest first."""
        rows = self._all(
            "SELECT * FROM documents WHERE collection_id = ? ORDER BY created_at", (collection_id,)
        )
        return [_row(Document, r) for r in rows]

    @_may_release_reserve
    def update_progress(
        self,
        document_id: DocumentId,
        *,
        status: DocumentStatus,
        stage: IngestStage,
        pages_done: int,
        pages_total: int,
        error: str | None = None,
        skipped_pages: Sequence[SkippedPage] | None = None,
        size_bytes: int | None = None,
    ) -> None:
        """Record ingestion progress of a document."""
        sets = "status=?, stage=?, pages_done=?, pages_total=?, error=?, updated_at=?"
        args: list[Any] = [status, stage, pages_done, pages_total,
                           None if error is None else safe_text(error), time.time()]
        if skipped_pages is not None:
            sets += ", skipped_pages=?"
            args.append(json.dumps(safe_value([asdict(p) for p in skipped_pages])))
        if size_bytes is not None:
            sets += ", size_bytes=?"
            args.append(int(size_bytes))
        with self._tx() as c:
            n = c.execute(f"UPDATE documents SET {sets} WHERE id=?",
                          (*args, document_id)).rowcount
        if n == 0:
            raise NotFoundError(f"document {document_id} not found")

    def put_pages(self, document_id: DocumentId, pages: Sequence[Page]) -> None:
        """Replace all page records of a document in one transaction."""
        with self._tx() as c:
            if c.execute("SELECT 1 FROM documents WHERE id = ?", (document_id,)).fetchone() is None:
                raise NotFoundError(f"document {document_id} not found")
            c.execute("DELETE FROM pages WHERE document_id = ?", (document_id,))
            names = [f.name for f in fields(Page)]
            c.executemany(
                f"INSERT INTO pages ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                [tuple(safe_value(asdict(p)).values()) for p in pages],
            )

    def list_pages(
        self, collection_id: CollectionId, document_ids: Sequence[DocumentId] | None = None
    ) -> list[Page]:
        """Pages of ready documents in a collection (optionally only some documents)."""
        sql = (
            "SELECT p.* FROM pages p JOIN documents d ON d.id = p.document_id "
            "WHERE d.collection_id = ? AND d.status = 'ready'"
        )
        args: list[Any] = [collection_id]
        if document_ids is not None:
            sql += f" AND d.id IN ({', '.join('?' for _ in document_ids)})"
            args.extend(document_ids)
        rows = self._all(sql + " ORDER BY d.created_at, p.number", args)
        return [_row(Page, r) for r in rows]

    def get_pages(self, keys: Sequence[tuple[DocumentId, int]]) -> list[Page]:
        """The pages of ready documents named by `(document id, 1-based number)`, in the
        order of `keys`; keys of missing pages or documents that are not ready are skipped."""
        found: dict[tuple[str, int], Page] = {}
        for start in range(0, len(keys), 200):  # well under SQLite's bound-variable limit
            chunk = keys[start:start + 200]
            where = " OR ".join("(p.document_id = ? AND p.number = ?)" for _ in chunk)
            rows = self._all(
                "SELECT p.* FROM pages p JOIN documents d ON d.id = p.document_id "
                f"WHERE d.status = 'ready' AND ({where})",
                [x for key in chunk for x in key])
            for row in rows:
                page = _row(Page, row)
                found[(page.document_id, page.number)] = page
        return [found[k] for k in ((str(d), int(n)) for d, n in keys) if k in found]

    @_may_release_reserve
    def delete_document(self, document_id: DocumentId) -> list[str]:
        """Delete a document and its pages; return the page hashes no other document uses."""
        with self._tx() as c:
            hashes = {r["page_hash"] for r in c.execute(
                "SELECT page_hash FROM pages WHERE document_id = ?", (document_id,))}
            c.execute("DELETE FROM pages WHERE document_id = ?", (document_id,))
            if c.execute("DELETE FROM documents WHERE id = ?", (document_id,)).rowcount == 0:
                raise NotFoundError(f"document {document_id} not found")
            orphans = [h for h in sorted(hashes) if c.execute(
                "SELECT 1 FROM pages WHERE page_hash = ? LIMIT 1", (h,)).fetchone() is None]
        return orphans

    def page_hash_in_use(self, page_hash: str) -> bool:
        """Whether any document's page references this KV page hash."""
        row = self._one("SELECT 1 FROM pages WHERE page_hash = ? LIMIT 1", (page_hash,))
        return row is not None

    # jobs
    def add_job(self, job: Job) -> None:
        """Insert a new job record."""
        self._insert("jobs", job, f"job {job.id} already exists")

    def get_job(self, job_id: JobId) -> Job:
        """The job, or `NotFoundError`."""
        row = self._one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if row is None:
            raise NotFoundError(f"job {job_id} not found")
        job: Job = _row(Job, row)
        return job

    @_may_release_reserve
    def update_job(self, job_id: JobId, *, status: JobStatus, error: str | None = None) -> None:
        """Record a job's status."""
        with self._tx() as c:
            n = c.execute("UPDATE jobs SET status=?, error=?, updated_at=? WHERE id=?",
                          (status, None if error is None else safe_text(error), time.time(),
                           job_id)).rowcount
        if n == 0:
            raise NotFoundError(f"job {job_id} not found")

    @_may_release_reserve
    def claim_job(self, job_id: JobId, lease_s: float) -> Job | None:
        """Take a queued job, or a running one whose lease expired; None if finished or held."""
        now = time.time()
        with self._tx() as c:
            row = c.execute("SELECT status, updated_at FROM jobs WHERE id = ?",
                            (job_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"job {job_id} not found")
            if row["status"] in ("succeeded", "failed") or (
                    row["status"] == "running" and now - row["updated_at"] < lease_s):
                return None
            c.execute("UPDATE jobs SET status='running', error=NULL, updated_at=?, "
                      "attempts=attempts+1 WHERE id=?", (now, job_id))
        return self.get_job(job_id)

    @_may_release_reserve
    def heartbeat_job(self, job_id: JobId) -> None:
        """Renew a running job's lease."""
        with self._tx() as c:
            c.execute("UPDATE jobs SET updated_at=? WHERE id=? AND status='running'",
                      (time.time(), job_id))

    def list_active_jobs(self) -> list[Job]:
        """Every queued or running job, oldest first."""
        rows = self._all("SELECT * FROM jobs WHERE status IN ('queued', 'running') "
                         "ORDER BY created_at", ())
        return [_row(Job, r) for r in rows]

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()
