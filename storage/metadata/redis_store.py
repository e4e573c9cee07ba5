"""Redis metadata store for the distributed form: same semantics as `SQLiteMetadataStore`.

Records are Redis hashes whose field values are JSON (pages are one JSON object per page
number, the embedding base64-encoded); no pickle. Every multi-key change runs as one Lua
script, so it is atomic. Page reference counting uses one set per page hash
(`ref:<hash>` = ids of the documents whose pages use it): a hash is an orphan when its set
empties. Key layout under `prefix` (default `conduit:meta`):

    col:<id> (hash)       colnames (hash json([tenant, name]) -> id)   tenant:<tenant> (zset)
    doc:<id> (hash)       coldocs:<collection id> (zset by created_at)
    pages:<doc> (hash number -> page JSON)   dochashes:<doc> (set)   ref:<page hash> (set)
    job:<id> (hash)       activejobs (zset of queued/running job ids by heartbeat time)

Scripts touch keys derived from the prefix, so this targets a standalone (or primary)
Redis, not Redis Cluster.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from storage.errors import ConflictError, NotFoundError, QuotaExceededError, UnavailableError
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
from storage.metadata.redis_scripts import SCRIPTS
from storage.metadata.usage import Quota, Usage
from storage.text_safety import safe_text, safe_value

T = TypeVar("T")


def _encode(record: Any) -> list[str]:
    """Flatten a record dataclass to HSET arguments `[field, json, ...]`."""
    out: list[str] = []
    for name, value in asdict(record).items():
        out += [name, json.dumps(safe_value(value))]
    return out


def _decode(cls: type[T], raw: dict[str, str]) -> T:
    """A record from its hash; text written before issue 30 may hold lone surrogates (JSON
    carries them as escapes): repaired."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: safe_value(json.loads(v)) for k, v in raw.items() if k in names})


def _page_json(page: Page) -> str:
    data = safe_value(asdict(page))
    emb = data.pop("embedding")
    data["embedding"] = None if emb is None else base64.b64encode(emb).decode()
    return json.dumps(data)


def _page_from_json(text: str) -> Page:
    data = safe_value(json.loads(text))
    emb = data.get("embedding")
    data["embedding"] = None if emb is None else base64.b64decode(emb)
    return Page(**data)


class RedisMetadataStore:
    """`MetadataStore` in Redis at `url` (`redis://` or `rediss://`, password in the URL).

    Connection failures are retried with exponential backoff; if Redis stays unreachable the
    call raises `UnavailableError`.
    """

    def __init__(self, url: str, *, prefix: str = "conduit:meta", attempts: int = 3) -> None:
        self.prefix = prefix
        self._r = redis.Redis.from_url(url, decode_responses=True, retry=Retry(NoBackoff(), 0),
                                       socket_connect_timeout=2.0, socket_timeout=30.0)
        self._retrying = Retrying(
            stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=0.05, max=1.0),
            retry=retry_if_exception_type((redis.ConnectionError, redis.TimeoutError)),
            reraise=True)
        self._scripts = {name: self._r.register_script(src) for name, src in SCRIPTS.items()}

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            result: T = self._retrying(fn)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise UnavailableError(f"metadata Redis unreachable: {exc}") from exc
        return result

    def _script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        return self._call(lambda: self._scripts[name](keys=keys, args=args))

    def _hgetall(self, key: str) -> dict[str, str]:
        raw = self._call(lambda: self._r.hgetall(key))
        return {str(k): str(v) for k, v in raw.items()}

    def _ids(self, key: str) -> list[str]:
        return [str(i) for i in self._call(lambda: self._r.zrange(key, 0, -1))]

    def _hgetall_many(self, keys: Sequence[str]) -> list[dict[str, str]]:
        def run() -> list[dict[str, str]]:
            pipe = self._r.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            return list(pipe.execute())
        return self._call(run) if keys else []

    # collections
    def create_collection(self, name: str, tenant: str, shared: bool = False) -> Collection:
        """Create a collection; `ConflictError` if the tenant already has one of that name."""
        name, tenant = safe_text(name), safe_text(tenant)
        col = Collection(id=CollectionId(new_id("col")), name=name, tenant=tenant, shared=shared)
        got = self._script("create_collection",
                           [self._k("colnames"), self._k("col", col.id), self._k("tenant", tenant)],
                           [json.dumps([tenant, name]), col.id, repr(col.created_at),
                            *_encode(col)])
        if got != col.id:
            raise ConflictError(f"collection {name!r} already exists")
        return col

    def get_collection(self, collection_id: CollectionId) -> Collection:
        """The collection, or `NotFoundError`."""
        raw = self._hgetall(self._k("col", collection_id))
        if not raw:
            raise NotFoundError(f"collection {collection_id} not found")
        return _decode(Collection, raw)

    def find_collection(self, name: str, tenant: str) -> Collection | None:
        """The tenant's collection of that name, if any."""
        name, tenant = safe_text(name), safe_text(tenant)
        cid = self._call(lambda: self._r.hget(self._k("colnames"), json.dumps([tenant, name])))
        if cid is None:
            return None
        try:
            return self.get_collection(CollectionId(str(cid)))
        except NotFoundError:
            return None

    def list_collections(self, tenant: str) -> list[Collection]:
        """The tenant's collections, oldest first."""
        ids = self._ids(self._k("tenant", tenant))
        raws = self._hgetall_many([self._k("col", i) for i in ids])
        return [_decode(Collection, raw) for raw in raws if raw]

    def delete_collection(self, collection_id: CollectionId) -> None:
        """Delete an empty collection (`ConflictError` if it still holds documents)."""
        col = self.get_collection(collection_id)
        res = self._script(
            "delete_collection",
            [self._k("col", col.id), self._k("coldocs", col.id), self._k("colnames"),
             self._k("tenant", col.tenant)],
            [json.dumps([col.tenant, col.name]), col.id])
        if res == -1:
            raise NotFoundError(f"collection {collection_id} not found")
        if res == 0:
            raise ConflictError(f"collection {collection_id} still holds documents")

    # documents
    def add_document(self, document: Document, quota: Quota | None = None) -> None:
        """Insert a new document record (`ConflictError` if its id exists); with `quota`,
        only if its collection's tenant stays within it (`QuotaExceededError` otherwise),
        checked in the insert's script."""
        cid = document.collection_id
        q = quota or Quota()
        res = self._script(
            "add_document",
            [self._k("col", cid), self._k("doc", document.id), self._k("coldocs", cid)],
            [document.id, repr(document.created_at), self._k(""), q.bytes, q.documents,
             q.pages, document.size_bytes, document.pages_total, *_encode(document)])
        if res == -1:
            raise NotFoundError(f"collection {cid} not found")
        if res == 0:
            raise ConflictError(f"document {document.id} already exists")
        if isinstance(res, list):
            name = ("bytes", "documents", "pages")[int(res[1]) - 1]
            adding = {"bytes": document.size_bytes, "documents": 1,
                      "pages": document.pages_total}[name]
            raise QuotaExceededError(name, getattr(q, name), int(res[2]), adding)

    def usage(self, tenant: str) -> Usage:
        """What the tenant's documents take (`storage.metadata.usage`), in one script."""
        got = self._script("usage", [], [self._k(""), safe_text(tenant)])
        return Usage(*(int(x) for x in got))

    def get_document(self, document_id: DocumentId) -> Document:
        """The document, or `NotFoundError`."""
        raw = self._hgetall(self._k("doc", document_id))
        if not raw:
            raise NotFoundError(f"document {document_id} not found")
        return _decode(Document, raw)

    def list_documents(self, collection_id: CollectionId) -> list[Document]:
        """Documents of a collection, oldest first."""
        ids = self._ids(self._k("coldocs", collection_id))
        raws = self._hgetall_many([self._k("doc", i) for i in ids])
        return [_decode(Document, raw) for raw in raws if raw]

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
        values: dict[str, Any] = {
            "status": status, "stage": stage, "pages_done": pages_done,
            "pages_total": pages_total, "error": error, "updated_at": time.time()}
        if skipped_pages is not None:
            values["skipped_pages"] = [asdict(p) for p in skipped_pages]
        if size_bytes is not None:
            values["size_bytes"] = int(size_bytes)
        args = [x for k, v in values.items() for x in (k, json.dumps(safe_value(v)))]
        if not self._script("update", [self._k("doc", document_id)], args):
            raise NotFoundError(f"document {document_id} not found")

    def put_pages(self, document_id: DocumentId, pages: Sequence[Page]) -> None:
        """Replace all page records of a document in one transaction."""
        pairs = [x for p in pages for x in (str(p.number), _page_json(p))]
        hashes = sorted({p.page_hash for p in pages})
        res = self._script(
            "put_pages",
            [self._k("doc", document_id), self._k("pages", document_id),
             self._k("dochashes", document_id)],
            [self._k("ref", ""), document_id, len(pages), *pairs, *hashes])
        if res == -1:
            raise NotFoundError(f"document {document_id} not found")

    def list_pages(
        self, collection_id: CollectionId, document_ids: Sequence[DocumentId] | None = None
    ) -> list[Page]:
        """Pages of ready documents in a collection (optionally only some documents)."""
        ids = self._ids(self._k("coldocs", collection_id))
        if document_ids is not None:
            wanted = set(document_ids)
            ids = [i for i in ids if i in wanted]

        def run() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for i in ids:
                pipe.hget(self._k("doc", i), "status")
                pipe.hvals(self._k("pages", i))
            return list(pipe.execute())
        raw = self._call(run) if ids else []
        out: list[Page] = []
        for status, pages in zip(raw[0::2], raw[1::2], strict=True):
            if status is not None and json.loads(status) == "ready":
                out += sorted((_page_from_json(p) for p in pages), key=lambda p: p.number)
        return out

    def get_pages(self, keys: Sequence[tuple[DocumentId, int]]) -> list[Page]:
        """The pages of ready documents named by `(document id, 1-based number)`, in the
        order of `keys`; keys of missing pages or documents that are not ready are skipped."""
        docs = sorted({d for d, _ in keys})

        def run() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for d in docs:
                pipe.hget(self._k("doc", d), "status")
            for d, n in keys:
                pipe.hget(self._k("pages", d), str(n))
            return list(pipe.execute())
        raw = self._call(run) if keys else []
        ready = {d for d, status in zip(docs, raw[:len(docs)], strict=True)
                 if status is not None and json.loads(status) == "ready"}
        return [_page_from_json(text) for (d, _), text in zip(keys, raw[len(docs):], strict=True)
                if text is not None and d in ready]

    def delete_document(self, document_id: DocumentId) -> list[str]:
        """Delete a document and its pages; return the page hashes no other document uses."""
        doc = self.get_document(document_id)
        res = self._script(
            "delete_document",
            [self._k("doc", document_id), self._k("pages", document_id),
             self._k("dochashes", document_id), self._k("coldocs", doc.collection_id)],
            [self._k("ref", ""), document_id])
        if res == -1:
            raise NotFoundError(f"document {document_id} not found")
        return sorted(str(h) for h in res)

    def page_hash_in_use(self, page_hash: str) -> bool:
        """Whether any document's page references this KV page hash."""
        return bool(self._call(lambda: self._r.exists(self._k("ref", page_hash))))

    # jobs
    def add_job(self, job: Job) -> None:
        """Insert a new job record (`ConflictError` if its id exists)."""
        if not self._script("add_job", [self._k("job", job.id), self._k("activejobs")],
                            [repr(job.updated_at), job.id, *_encode(job)]):
            raise ConflictError(f"job {job.id} already exists")

    def get_job(self, job_id: JobId) -> Job:
        """The job, or `NotFoundError`."""
        raw = self._hgetall(self._k("job", job_id))
        if not raw:
            raise NotFoundError(f"job {job_id} not found")
        return _decode(Job, raw)

    def update_job(self, job_id: JobId, *, status: JobStatus, error: str | None = None) -> None:
        """Record a job's status."""
        now = time.time()
        args = [job_id, repr(now), "1" if status in ("succeeded", "failed") else "0",
                "status", json.dumps(status),
                "error", json.dumps(None if error is None else safe_text(error)),
                "updated_at", json.dumps(now)]
        if not self._script("update_job", [self._k("job", job_id), self._k("activejobs")], args):
            raise NotFoundError(f"job {job_id} not found")

    def claim_job(self, job_id: JobId, lease_s: float) -> Job | None:
        """Take a queued job, or a running one whose lease expired; None if finished or held."""
        res = self._script("claim_job", [self._k("job", job_id), self._k("activejobs")],
                           [job_id, repr(time.time()), repr(float(lease_s))])
        if res == -1:
            raise NotFoundError(f"job {job_id} not found")
        return self.get_job(job_id) if res == 1 else None

    def heartbeat_job(self, job_id: JobId) -> None:
        """Renew a running job's lease."""
        self._script("heartbeat_job", [self._k("job", job_id), self._k("activejobs")],
                     [job_id, repr(time.time())])

    def list_active_jobs(self) -> list[Job]:
        """Every queued or running job, oldest first (from the `activejobs` index)."""
        ids = self._ids(self._k("activejobs"))
        raws = self._hgetall_many([self._k("job", i) for i in ids])
        jobs = [_decode(Job, raw) for raw in raws if raw]
        return sorted((j for j in jobs if j.status in ("queued", "running")),
                      key=lambda j: j.created_at)

    def close(self) -> None:
        """Release connections."""
        self._r.close()
