"""Nothing stays stuck: job leases with a heartbeat, best-effort failure marking, and the reaper.

An ingest job is *claimed* (`MetadataStore.claim_job`) before it runs and its lease is renewed
by a heartbeat thread while it runs. A process that dies (SIGKILL, OOM, power) stops beating;
the reaper, which runs in the API process at startup and then every `reaper_interval_s`,
requeues every ingest job whose lease expired, and every queued job that no queue holds any
more (embedded form: the in-process queue died with the process; distributed: its message was
lost, e.g. taken by a worker that froze and was killed). A job claimed more than
`max_ingest_attempts` times (a document that keeps killing its worker) fails its document with a
message instead. Claims are atomic, so a requeue that races a redelivered Celery message or a
live worker runs the job once.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from tenacity import Retrying, stop_after_attempt, wait_exponential

from storage.errors import NotFoundError
from storage.keys import PageHash
from storage.metadata import Document, DocumentId, Job, JobId, MetadataStore
from storage.metadata.records import JobStatus
from worker.context import WorkerContext

log = logging.getLogger(__name__)

Submit = Callable[[JobId, DocumentId], None]


def gave_up_message(attempts: int) -> str:
    """The error of a document whose ingest stopped without finishing too often."""
    return (f"ingestion was started {attempts} times and its worker stopped each time without "
            "finishing (crashed, killed, or out of memory); the document is not retried")


def remove_page_images(ctx: WorkerContext, document_id: str) -> None:
    """Delete a document's rendered page images (a failed or deleted document keeps none)."""
    shutil.rmtree(ctx.home / "pages" / document_id, ignore_errors=True)


def mark_failed(ctx: WorkerContext, document_id: DocumentId, job_id: JobId | None,
                message: str, *, pages_total: int = 0, attempts: int = 5,
                max_wait_s: float = 5.0) -> bool:
    """Fail a document and its job with `message` and remove its page images; best effort.

    Storage errors (Redis restarting, SQLite out of disk) are retried with backoff; if every
    attempt fails this logs and returns False, and the job's lease (no longer renewed) lets
    the reaper finish the work later. Never raises for a storage problem.
    """
    remove_page_images(ctx, document_id)

    def write() -> None:
        try:
            ctx.meta.update_progress(document_id, status="failed", stage="done", pages_done=0,
                                     pages_total=pages_total, error=message)
        except NotFoundError:
            pass  # deleted meanwhile: nothing left to mark
        if job_id is not None:
            ctx.meta.update_job(job_id, status="failed", error=message)

    try:
        for attempt in Retrying(stop=stop_after_attempt(attempts), reraise=True,
                                wait=wait_exponential(multiplier=0.2, max=max_wait_s)):
            with attempt:
                write()
    except Exception as exc:  # a storage or disk error that outlived every retry
        log.error("could not mark %s failed (%s: %s); the reaper will retry", document_id,
                  type(exc).__name__, exc)
        return False
    return True


def release_unreferenced(ctx: WorkerContext, page_hashes: Iterable[str]) -> list[PageHash]:
    """Delete the cached KV of pages no document references any more: a question that
    prefilled (or promoted) the pages of a document deleted meanwhile leaves no orphan
    entries behind (in Redis they would have no TTL)."""
    try:
        doomed = [PageHash(h) for h in dict.fromkeys(page_hashes)
                  if not ctx.meta.page_hash_in_use(h)]
        if doomed:
            ctx.kv.delete(doomed)
            log.info("released %d cached page(s) of documents deleted during a question",
                     len(doomed))
    except Exception as exc:  # best effort: never mask the question's own outcome
        log.warning("could not release unreferenced pages: %s", exc)
        return []
    return doomed


@contextmanager
def heartbeat(meta: MetadataStore, job_id: JobId, every_s: float) -> Iterator[None]:
    """Renew the job's lease every `every_s` seconds while the block runs (a beat that fails,
    e.g. while Redis restarts, is logged and tried again at the next interval)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            try:
                meta.heartbeat_job(job_id)
            except Exception as exc:  # a missed beat is retried; the lease is several beats
                log.warning("heartbeat of %s failed: %s", job_id, exc)

    thread = threading.Thread(target=beat, name=f"lease-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


@dataclass
class ReapReport:
    """What one reaper pass did, by job id."""

    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)  # job records of finished/deleted documents


def job_outcome(doc: Document) -> JobStatus | None:
    """What a finished document says of its ingest job ("succeeded" or "failed"); None while
    it is queued or processing. The document's status is written first and is the truth."""
    if doc.status == "ready":
        return "succeeded"
    if doc.status == "failed":
        return "failed"
    return None


def settled_job(job: Job, doc: Document) -> Job:
    """`job` as its document shows it: an unfinished ingest job whose document is ready or
    failed is reported finished (its own record follows a moment later, or after a crash when
    `reap` closes it)."""
    outcome = job_outcome(doc)
    if job.status not in ("queued", "running") or doc.job_id != job.id or outcome is None:
        return job
    return replace(job, status=outcome, error=doc.error)


def job_is_stale(job: Job, lease_s: float, now: float | None = None) -> bool:
    """Whether a running job's lease has expired (its worker stopped beating)."""
    now = time.time() if now is None else now
    return job.status == "running" and now - job.updated_at >= lease_s


def reap(ctx: WorkerContext, submit: Submit, held: set[JobId] | None,
         started_at: float = 0.0) -> ReapReport:
    """One pass: requeue dead ingest jobs, fail those out of attempts, close orphan records.

    `held` is the set of jobs whose queue entry exists: this process's own queue (embedded
    form) or the broker's waiting and unacknowledged messages (distributed); a queued job
    outside it is an orphan and is requeued if it was queued before this process started
    (`started_at`) or has waited a whole lease (an upload between its record and its submit
    is not an orphan). The requeued job is held again, so it is sent once per loss. `None`
    (the broker could not be read) requeues no queued job this pass.
    """
    s = ctx.settings
    report = ReapReport()
    now = time.time()
    for job in ctx.meta.list_active_jobs():
        if job.kind != "ingest" or job.document_id is None:
            continue
        orphan = (job.status == "queued" and held is not None
                  and job.id not in held
                  and (job.updated_at < started_at or now - job.updated_at >= s.worker.job_lease_s))
        if not (orphan or job_is_stale(job, s.worker.job_lease_s)):
            continue
        try:
            doc = ctx.meta.get_document(job.document_id)
        except NotFoundError:
            ctx.meta.update_job(job.id, status="failed", error="the document was deleted")
            report.closed.append(job.id)
            continue
        outcome = job_outcome(doc)
        if outcome is not None:  # finished, but its job record was not updated
            ctx.meta.update_job(job.id, status=outcome, error=doc.error)
            report.closed.append(job.id)
        elif job.attempts >= s.worker.max_ingest_attempts:
            if mark_failed(ctx, doc.id, job.id, gave_up_message(job.attempts),
                           pages_total=doc.pages_total):
                report.failed.append(job.id)
        else:
            log.warning("requeueing ingest %s of %s (%s, attempt %d)", job.id, doc.id,
                        "orphaned in the queue" if orphan else "lease expired", job.attempts + 1)
            submit(job.id, doc.id)
            report.requeued.append(job.id)
    return report


class Reaper:
    """Runs `reap` at start and then every `interval_s` on a daemon thread until `stop`."""

    def __init__(self, ctx: WorkerContext, submit: Submit,
                 held_jobs: Callable[[], set[JobId] | None]) -> None:
        self._ctx = ctx
        self._submit = submit
        self._held_jobs = held_jobs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conduit-reaper", daemon=True)
        self._started_at = time.time()

    def start(self) -> None:
        """Start the thread (its first pass is the startup reconcile)."""
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                report = reap(self._ctx, self._submit, self._held_jobs(), self._started_at)
                if report.requeued or report.failed:
                    log.warning("reaper: requeued %s, failed %s", report.requeued, report.failed)
            except Exception as exc:  # storage down: try again next interval
                log.warning("reaper pass failed: %s: %s", type(exc).__name__, exc)
            if self._stop.wait(self._ctx.settings.worker.reaper_interval_s):
                return

    def stop(self) -> None:
        """Stop the thread (waits for a pass in progress)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
