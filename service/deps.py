"""FastAPI dependencies: the worker context, the job runner, and the caller's tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request

from service.auth import KeyRing, bearer_token
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


def get_tenant(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> str:
    """Authenticate the caller; with no API keys configured everyone is tenant `default`.
    (`service.guard` has already refused bad keys before the body was read; this maps the
    key to its tenant.)"""
    keyring: KeyRing = request.app.state.keyring
    if not keyring.enabled:
        return "default"
    token = bearer_token(authorization)
    if token is None:
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    tenant = keyring.tenant(token)
    if tenant is None:
        raise HTTPException(401, "invalid API key", headers={"WWW-Authenticate": "Bearer"})
    return tenant


TenantDep = Annotated[str, Depends(get_tenant)]
