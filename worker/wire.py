"""JSON forms of the answer seam's dataclasses, for Celery tasks and Redis messages (no pickle)."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from conduit_core.policies.choice import PolicyOptions
from storage.metadata import CollectionId, DocumentId
from worker.answer_job import Answer, Citation, Question
from worker.conversation_turns import PastTurn
from worker.page_cache import CacheReport
from worker.retrieval.snippet import Snippet


def question_to_json(q: Question) -> dict[str, Any]:
    """A JSON-safe dict of a `Question` (its resolved `choice` stays in the process)."""
    data = asdict(replace(q, choice=None))
    del data["choice"]
    data["document_ids"] = None if q.document_ids is None else list(q.document_ids)
    return data


def question_from_json(data: dict[str, Any]) -> Question:
    """Inverse of `question_to_json`."""
    opts = dict(data["options"])
    if isinstance(opts.get("score_layers"), list):
        opts["score_layers"] = tuple(opts["score_layers"])
    docs = data["document_ids"]
    history = tuple(PastTurn(t["question"], t["answer"],
                             None if t["pages"] is None else tuple(t["pages"]))
                    for t in data.get("history", ()))
    return Question(**{**data, "collection_id": CollectionId(data["collection_id"]),
                       "document_ids": None if docs is None else [DocumentId(d) for d in docs],
                       "options": PolicyOptions(**opts), "history": history})


def answer_to_json(a: Answer) -> dict[str, Any]:
    """A JSON-safe dict of an `Answer`."""
    return asdict(a)


def answer_from_json(data: dict[str, Any]) -> Answer:
    """Inverse of `answer_to_json`."""
    return Answer(**{**data, "citations": [_citation(c) for c in data["citations"]],
                     "cache": CacheReport(**data["cache"])})


def _citation(data: dict[str, Any]) -> Citation:
    snip = data.get("snippet")
    if snip is not None:
        snip = Snippet(**{**snip, "spans": tuple((s, e) for s, e in snip["spans"])})
    return Citation(**{**data, "snippet": snip})
