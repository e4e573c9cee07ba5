"""FastAPI dependencies: the worker, the thumbnail cache, and the caller's tenant."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Path, Request

from service.auth import KeyRing, bearer_token
from service.thumbnails import ThumbnailCache
from worker.facade import Worker


def get_worker(request: Request) -> Worker:
    """The process's worker (`worker.facade.Worker`, built at startup)."""
    worker: Worker = request.app.state.worker
    return worker


def get_thumbnails(request: Request) -> ThumbnailCache:
    """The process-wide cache of page thumbnails."""
    cache: ThumbnailCache = request.app.state.thumbnails
    return cache


WorkerDep = Annotated[Worker, Depends(get_worker)]
ThumbnailsDep = Annotated[ThumbnailCache, Depends(get_thumbnails)]


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

# Ids in paths: conduit's ids are `col_`, `doc_` or `job_` and 20 hex digits. A path id that
# could not be one is a 422; any other id that names nothing the caller owns is the same 404,
# whoever owns it.
ID_PATTERN = r"^[A-Za-z0-9_\-]+$"
ID_MAX = 64
CollectionIdPath = Annotated[str, Path(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)]
DocumentIdPath = Annotated[str, Path(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)]
JobIdPath = Annotated[str, Path(min_length=1, max_length=ID_MAX, pattern=ID_PATTERN)]
PageNumberPath = Annotated[int, Path(ge=1, le=1_000_000, description="1-based page number.")]
