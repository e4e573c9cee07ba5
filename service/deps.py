"""FastAPI dependencies: the worker context, the job runner, and the caller's tenant."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request

from worker.context import WorkerContext
from worker.jobs import JobRunner


def get_ctx(request: Request) -> WorkerContext:
    """The process-wide worker context."""
    ctx: WorkerContext = request.app.state.ctx
    return ctx


def get_runner(request: Request) -> JobRunner:
    """The job runner (in-process or Celery)."""
    runner: JobRunner = request.app.state.runner
    return runner


CtxDep = Annotated[WorkerContext, Depends(get_ctx)]
RunnerDep = Annotated[JobRunner, Depends(get_runner)]


def tenant_of_key(key: str) -> str:
    """A stable tenant name derived from an API key (the key itself is never stored)."""
    return "t_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def get_tenant(
    ctx: CtxDep, authorization: Annotated[str | None, Header()] = None
) -> str:
    """Authenticate the caller; with no API keys configured everyone is tenant `default`."""
    keys = [k.get_secret_value() for k in ctx.settings.api_keys]
    if not keys:
        return "default"
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    for key in keys:
        if hmac.compare_digest(token.encode(), key.encode()):
            return tenant_of_key(key)
    raise HTTPException(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})


TenantDep = Annotated[str, Depends(get_tenant)]
