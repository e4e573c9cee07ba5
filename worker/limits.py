"""Request limits the worker enforces before any model work: question length in tokens.

The scoring pass's memory grows with the number of question tokens it scores (4,000 emoji are
about 16k tokens: the process was OOM-killed at 22.6 GB), so questions are capped in the
model's own tokens (`max_question_tokens`, 422 with the limit) and the service scores with a
bounded window of them (`query_window`).
"""

from __future__ import annotations

from worker.context import WorkerContext
from worker.errors import WorkerError


class QuestionTooLongError(WorkerError):
    """The question has more model tokens than the deployment accepts."""

    http_status = 422


def question_tokens(ctx: WorkerContext, question: str) -> int:
    """How many tokens the model's tokenizer makes of the question."""
    tokenizer = ctx.runtime.vlm.tokenizer
    return len(tokenizer(question, add_special_tokens=False)["input_ids"])


def check_question_length(ctx: WorkerContext, question: str, *, with_model: bool) -> None:
    """`QuestionTooLongError` (422, naming the limit) for a question over the token cap.

    Without the model (an API process in the distributed form) only the bound that needs no
    tokenizer is checked: a byte-level tokenizer makes at most one token per UTF-8 byte, so a
    question of at most `limit` bytes always passes; longer ones are counted by the worker.
    """
    limit = ctx.settings.worker.max_question_tokens
    if len(question.encode()) <= limit or not with_model:
        return
    n = question_tokens(ctx, question)
    if n > limit:
        raise QuestionTooLongError(
            f"the question is {n} tokens long; the limit is {limit} tokens "
            "(CONDUIT_MAX_QUESTION_TOKENS)")
