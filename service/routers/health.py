"""Liveness and readiness probes (open: no key), and the serving configuration (keyed)."""

from __future__ import annotations

from fastapi import APIRouter

from service.deps import CtxDep, TenantDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up. `async` on purpose: it runs on the event loop, so it never waits
    behind answers in the worker-thread pool."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ctx: CtxDep) -> dict[str, object]:
    """The stores answer (503 when they do not). Says nothing about the deployment: probes
    call it without a key."""
    ctx.meta.list_collections("default")
    return {"status": "ready"}


@router.get("/v1/info")
def info(ctx: CtxDep, _tenant: TenantDep) -> dict[str, object]:
    """The serving configuration: model, form, policy, budget, whether this process loaded the
    model."""
    s = ctx.settings
    return {"model": s.model, "embedded": s.embedded, "policy": s.policy, "budget": s.budget,
            "max_question_tokens": s.max_question_tokens, "model_loaded": ctx.model_loaded}
