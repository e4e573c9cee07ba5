"""A follow-up's earlier turns: which pages each one added, which turns it keeps, and the
pages retrieval brings for it.

What it decides:
  Retrieval reads the conversation (`conversation_hits`): the follow-up's question and each
  earlier user turn are ranked alone, and a page's score is the sum of its fused scores,
  each weighted by `conversation_recency` to the power of how many turns back the question
  is (no rewrite by a model). A page that only an earlier turn names is found so.
  The pages a turn added (`turn_pages`) are those its retrieval found that no earlier turn
  had, in reading order; a turn that names them (a stored conversation) keeps them, one that
  does not (OpenAI chat, stateless) finds them again by the same retrieval, so the same
  messages give the same conversation. A deleted document's pages leave every turn.
  Bounds (`fit_turns`): at most `conversation_max_turns` answered turns, and their pages'
  tokens with the text's at most `conversation_max_tokens` (and the model's context); the
  oldest turns go first, and the answer says how many went.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from storage.metadata import DocumentId, Page
from worker.context import WorkerContext

# each question of a conversation is ranked this many times deeper than its top-k (at most
# MAX_DEPTH pages), so that a page ranked low by one turn can still add up over the turns
DEPTH, MAX_DEPTH = 3, 96

Rank = Callable[[str, int], list[tuple[Page, float]]]  # (question, top-k) -> pages, scores


@dataclass(frozen=True)
class PastTurn:
    """An answered turn a follow-up reads: its question, its answer's text and, when known,
    the pages it added ("document_id:number"; None: found again by retrieval)."""

    question: str
    answer: str
    pages: tuple[str, ...] | None = None


def page_key(page: Page) -> str:
    """A page's key in a turn: "document_id:number"."""
    return f"{page.document_id}:{page.number}"


def conversation_hits(ctx: WorkerContext, questions: Sequence[str], top_k: int,
                      rank: Rank) -> list[tuple[Page, float]]:
    """The top-k pages for the last of `questions` read with the ones before it (module
    docstring), best first, with their weighted scores; `rank` ranks one question alone."""
    recency = ctx.settings.worker.conversation_recency
    scores: dict[str, float] = {}
    pages: dict[str, Page] = {}
    for back, question in enumerate(reversed(questions)):
        for page, score in rank(question, min(MAX_DEPTH, DEPTH * top_k)):
            key = page_key(page)
            pages[key] = page
            scores[key] = scores.get(key, 0.0) + score * recency ** back
    best = sorted(scores, key=lambda k: -scores[k])[:top_k]
    return [(pages[k], scores[k]) for k in best]


def turn_pages(ctx: WorkerContext, history: Sequence[PastTurn], top_k: int, rank: Rank,
               order: Callable[[list[tuple[Page, float]]], list[Page]]) -> list[list[Page]]:
    """The pages each turn of `history` added, oldest first (module docstring)."""
    seen: set[str] = set()
    added: list[list[Page]] = []
    for k, turn in enumerate(history):
        if turn.pages is not None:
            keys = [(DocumentId(d), int(n)) for d, _, n in
                    (key.rpartition(":") for key in turn.pages)]
            found = ctx.meta.get_pages(keys)
        else:
            questions = [t.question for t in history[:k + 1]]
            found = order(conversation_hits(ctx, questions, top_k, rank))
        own = [p for p in found if page_key(p) not in seen]
        seen.update(page_key(p) for p in own)
        added.append(own)
    return added


def fit_turns(ctx: WorkerContext, history: Sequence[PastTurn], pages: list[list[Page]],
              page_tokens: Callable[[Page], int]) -> int:
    """How many of the oldest turns of `history` to drop so that the rest fit the bounds
    (module docstring); `pages` are those each added, `page_tokens` counts a page's."""
    if not history:
        return 0
    s = ctx.settings.worker
    context = int(getattr(ctx.runtime.adapter.text_config, "max_position_embeddings", 0) or 0)
    limit = min(s.conversation_max_tokens, context) if context else s.conversation_max_tokens
    tokenizer = ctx.runtime.vlm.tokenizer

    def text(turn: PastTurn) -> int:
        ids = tokenizer(turn.question + "\n" + turn.answer, add_special_tokens=False)
        return len(ids["input_ids"])

    sizes = [text(t) + sum(page_tokens(p) for p in added)
             for t, added in zip(history, pages, strict=True)]
    drop = max(0, len(sizes) - s.conversation_max_turns)
    # the asked turn's question and pages are not counted: they are bounded on their own
    while drop < len(sizes) and sum(sizes[drop:]) > limit:
        drop += 1
    return drop
