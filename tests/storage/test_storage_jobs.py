"""Job leases on both metadata stores: claim, heartbeat, the active-job index, attempts."""

from __future__ import annotations

import time

import pytest

from storage.errors import NotFoundError
from storage.metadata import Job, JobId, MetadataStore, new_id


def _job(meta: MetadataStore) -> Job:
    job = Job(id=JobId(new_id("job")), kind="ingest")
    meta.add_job(job)
    return job


def test_claim_takes_a_queued_job_once_and_counts_attempts(meta: MetadataStore) -> None:
    job = _job(meta)
    assert [j.id for j in meta.list_active_jobs()] == [job.id]
    claimed = meta.claim_job(job.id, lease_s=60)
    assert claimed is not None and claimed.status == "running" and claimed.attempts == 1
    # a second worker (a redelivered message, a reaper's requeue) finds a live lease
    assert meta.claim_job(job.id, lease_s=60) is None
    assert meta.get_job(job.id).attempts == 1


def test_an_expired_lease_can_be_claimed_again(meta: MetadataStore) -> None:
    job = _job(meta)
    assert meta.claim_job(job.id, lease_s=60) is not None
    time.sleep(0.05)
    again = meta.claim_job(job.id, lease_s=0.01)  # the holder stopped beating
    assert again is not None and again.attempts == 2


def test_heartbeat_renews_the_lease(meta: MetadataStore) -> None:
    job = _job(meta)
    first = meta.claim_job(job.id, lease_s=60)
    assert first is not None
    time.sleep(0.05)
    meta.heartbeat_job(job.id)
    assert meta.get_job(job.id).updated_at > first.updated_at
    assert meta.claim_job(job.id, lease_s=0.04) is None  # beat within the lease


def test_finished_jobs_leave_the_active_index_and_cannot_be_claimed(
        meta: MetadataStore) -> None:
    done, failed, waiting = _job(meta), _job(meta), _job(meta)
    meta.claim_job(done.id, lease_s=60)
    meta.update_job(done.id, status="succeeded")
    meta.update_job(failed.id, status="failed", error="boom")
    assert [j.id for j in meta.list_active_jobs()] == [waiting.id]
    assert meta.claim_job(done.id, lease_s=0) is None
    assert meta.claim_job(failed.id, lease_s=0) is None
    meta.heartbeat_job(done.id)  # a late beat does not revive it
    assert meta.get_job(done.id).status == "succeeded"
    assert [j.id for j in meta.list_active_jobs()] == [waiting.id]
    with pytest.raises(NotFoundError):
        meta.claim_job(JobId("job_missing"), lease_s=1)
