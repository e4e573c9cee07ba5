"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter

from service.deps import CtxDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ctx: CtxDep) -> dict[str, object]:
    """The stores answer; reports the serving configuration."""
    ctx.meta.list_collections("default")
    s = ctx.settings
    return {"status": "ready", "model": s.model, "embedded": s.embedded, "policy": s.policy,
            "budget": s.budget, "home": str(ctx.home),
            "model_loaded": ctx.model_loaded}
