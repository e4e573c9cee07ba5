"""Liveness and readiness probes (open: no key), and the serving configuration (keyed).

Both probes are `async` routes that never wait for the request thread pool: `/healthz` does
no work, and `/readyz` runs its store check on a small executor of its own (`_PROBES`), so
they answer promptly while every request thread is busy (uploads, answers)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.deps import TenantDep, WorkerDep
from worker.facade import Worker

router = APIRouter(tags=["health"])

# the readiness checks' own threads: two, so one stuck store call leaves the next probe one
_PROBES = ThreadPoolExecutor(max_workers=2, thread_name_prefix="conduit-probe")
# a store that does not answer within this is reported not ready
_READY_TIMEOUT_S = 5.0


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up. `async` on purpose: it runs on the event loop, so it never waits
    behind answers in the worker-thread pool."""
    return {"status": "ok"}


@router.get("/readyz", response_model=None)
async def readyz(request: Request) -> dict[str, object] | JSONResponse:
    """The stores answer (503 when they do not, or not within 5 s). Says nothing about the
    deployment: probes call it without a key. The worker is read from the app, not through
    a dependency (a sync dependency would take a request thread)."""
    worker: Worker = request.app.state.worker
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(
            loop.run_in_executor(_PROBES, worker.meta.list_collections, "default"),
            _READY_TIMEOUT_S)
    except TimeoutError:
        return JSONResponse({"detail": "the metadata store did not answer in time"},
                            status_code=503, headers={"Retry-After": "5"})
    return {"status": "ready"}


@router.get("/v1/info")
def info(worker: WorkerDep, _tenant: TenantDep) -> dict[str, object]:
    """The serving configuration: model, form, policy, budget, whether this process loaded the
    model, and the formats an upload may have."""
    s = worker.settings
    return {"model": s.core.model, "embedded": s.embedded, "policy": s.core.policy,
            "budget": s.core.budget, "max_question_tokens": s.worker.max_question_tokens,
            "model_loaded": worker.model_loaded, "formats": worker.accepted_formats()}
