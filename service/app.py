"""The FastAPI application factory: one process serves the API and, in embedded mode, runs jobs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.utils import is_body_allowed_for_status_code
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.registry import Collector
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.auth import KeyRing
from service.guard import GuardMiddleware, validation_error
from service.hardening import LoopbackHostMiddleware, SecurityHeadersMiddleware, private_home
from service.metrics import (
    UPLOADS,
    HTTPMetricsMiddleware,
    register_kv_collector,
    register_queue_collector,
)
from service.routers import (
    collections,
    conversations,
    documents,
    health,
    models,
    openai_chat,
    pages,
    query,
    usage,
)
from service.routers.ui import mount_ui
from service.thumbnails import ThumbnailCache
from storage.errors import (
    ConflictError,
    DiskFullError,
    NotFoundError,
    QuotaExceededError,
    UnavailableError,
)
from storage.space import is_disk_full
from storage.text_safety import safe_text, safe_value
from worker.facade import IngestError, Worker, WorkerError
from worker.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; stores open at startup and close at shutdown."""
    settings = settings or Settings()
    keyring = KeyRing.from_settings(settings)  # a malformed keys file stops the start here
    private_home(settings.storage.home.resolve())  # umask 077: everything under it is the service's

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the runner, the reaper and the retrieval index check start with it
        app.state.worker = worker = Worker.serve(settings, keyed=keyring.enabled)
        collectors: list[Collector] = [register_kv_collector(worker.kv)]
        if not settings.embedded:  # jobs wait in the broker's queues: export their lengths
            collectors.append(register_queue_collector(worker.queue_lengths))
        log.info("conduit up: home=%s model=%s embedded=%s", worker.home, settings.core.model,
                 settings.embedded)
        try:
            yield
        finally:
            for collector in collectors:
                REGISTRY.unregister(collector)
            worker.close()

    # /docs and /redoc with Swagger UI and ReDoc served from the installed fastapi-offline
    # package, not a CDN: they work on an air-gapped cluster (no validator badge either)
    app = FastAPIOffline(title="conduit", version="0.1.0", lifespan=lifespan,
                         description="Document question answering over cached page KV.",
                         static_url="/docs-static",
                         swagger_ui_parameters={"validatorUrl": None})
    app.state.keyring = keyring
    app.state.thumbnails = ThumbnailCache()
    app.add_middleware(GuardMiddleware, keyring=keyring,
                       max_upload_bytes=settings.worker.max_upload_bytes)
    if not keyring.enabled:  # the open mode: loopback Host names only (DNS rebinding)
        app.add_middleware(LoopbackHostMiddleware, allowed=settings.service.allowed_hosts)
    app.add_middleware(SecurityHeadersMiddleware)  # outside the guard: on its 401s too
    # outermost: every response is counted, refusals included, by the route it was for
    app.add_middleware(HTTPMetricsMiddleware, routes=lambda: app.router.routes)
    for router in (collections.router, documents.router, pages.router, query.router,
                   models.router, openai_chat.router, health.router, usage.router,
                   conversations.router):
        app.include_router(router)
    mount_ui(app)
    _install_error_handlers(app)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


_DISK_FULL = ("the service's disk is full; the request was not completed (deleting documents "
              "frees space)")


def _install_error_handlers(app: FastAPI) -> None:
    """Every error reply is JSON `{"detail": ...}` in valid UTF-8 (library messages can carry
    lone surrogates); a request model built inside a handler that fails validation is a 422."""
    app.add_exception_handler(RequestValidationError, validation_error)

    @app.exception_handler(ValidationError)
    async def model_error(_: Request, exc: ValidationError) -> JSONResponse:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
                  for e in exc.errors(include_url=False, include_input=False,
                                      include_context=False)]
        return JSONResponse({"detail": safe_value(errors)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if not is_body_allowed_for_status_code(exc.status_code):
            return await http_exception_handler(request, exc)
        return JSONResponse({"detail": safe_value(exc.detail)}, status_code=exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(IngestError)
    async def ingest_error(_: Request, exc: IngestError) -> JSONResponse:
        UPLOADS.labels(type(exc).__name__).inc()
        return JSONResponse({"detail": safe_text(exc.message)},
                            status_code=exc.http_status, headers=_retry_after(exc))

    @app.exception_handler(NotFoundError)
    async def not_found(_: Request, exc: NotFoundError) -> JSONResponse:
        return JSONResponse({"detail": safe_text(str(exc))}, status_code=404)

    @app.exception_handler(ConflictError)
    async def conflict(_: Request, exc: ConflictError) -> JSONResponse:
        return JSONResponse({"detail": safe_text(str(exc))}, status_code=409)

    @app.exception_handler(QuotaExceededError)
    async def over_quota(_: Request, exc: QuotaExceededError) -> JSONResponse:
        return JSONResponse({"detail": safe_text(str(exc))}, status_code=413)

    @app.exception_handler(DiskFullError)
    async def disk_full(_: Request, exc: DiskFullError) -> JSONResponse:
        log.error("disk full: %s", exc)
        return JSONResponse({"detail": _DISK_FULL}, status_code=507)

    @app.exception_handler(OSError)
    async def os_error(_: Request, exc: OSError) -> JSONResponse:
        if not is_disk_full(exc):
            raise exc  # a 500, as any other unexpected error
        log.error("disk full: %s", exc)
        return JSONResponse({"detail": _DISK_FULL}, status_code=507)

    @app.exception_handler(UnavailableError)
    async def unavailable(_: Request, exc: UnavailableError) -> JSONResponse:
        log.warning("storage unavailable: %s", exc)
        return JSONResponse({"detail": "storage is unavailable; retry shortly"}, status_code=503,
                            headers={"Retry-After": "5"})

    @app.exception_handler(WorkerError)
    async def worker_error(_: Request, exc: WorkerError) -> JSONResponse:
        return JSONResponse({"detail": safe_text(exc.message)}, status_code=exc.http_status,
                            headers=_retry_after(exc))


def _retry_after(exc: WorkerError) -> dict[str, str] | None:
    """Retry-After for a refusal that passes (429, 503: queue full, readers busy, ...)."""
    if exc.http_status not in (429, 503):
        return None
    return {"Retry-After": str(getattr(exc, "retry_after_s", 5))}
