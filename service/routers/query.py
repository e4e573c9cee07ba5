"""`POST /v1/query`: answer a question over a collection with page citations."""

from __future__ import annotations

from fastapi import APIRouter

from service.deps import CtxDep, TenantDep
from service.routers.collections import owned_collection
from service.schemas import CitationOut, QueryIn, QueryOut
from storage.metadata import DocumentId
from worker.answer_job import Question, answer_question

router = APIRouter(tags=["query"])


@router.post("/v1/query", response_model=QueryOut)
def query(body: QueryIn, ctx: CtxDep, tenant: TenantDep) -> QueryOut:
    """Retrieve pages, reuse their cached KV with selective refresh, and answer."""
    col = owned_collection(ctx, tenant, body.collection_id)
    result = answer_question(ctx, Question(
        collection_id=col.id, question=body.question, top_k=body.top_k,
        max_new_tokens=body.max_new_tokens,
        document_ids=None if body.document_ids is None else [DocumentId(d) for d in
                                                              body.document_ids],
        policy=body.policy, budget=body.budget, temperature=body.temperature,
        bm25_weight=body.bm25_weight, dense_weight=body.dense_weight,
    ))
    return QueryOut(
        answer=result.answer,
        citations=[CitationOut(document_id=c.document_id, filename=c.filename, page=c.page,
                               score=c.score) for c in result.citations],
        policy=result.policy, budget=result.budget, flops_ratio=result.flops_ratio,
        refreshed_visual_tokens=result.refreshed_visual_tokens,
        visual_tokens=result.visual_tokens, timings=result.timings,
    )
