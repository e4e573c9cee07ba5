"""The token layout of a conversation: one sequence that only grows, turn after turn.

A conversation is `[head(prefix) | pages of turn 1 | question 1 | answer 1 | opening |
pages of turn 2 | question 2 | answer 2 | ...]`: turn 1 is laid out exactly as a single
question (`build_layout`), an answer is its text and the end of the assistant's turn
(`VLMAdapter.answer_ids`), and every later turn opens a new user turn (`page_opening_ids`)
before the pages it brings, each after its label, and its question with the generation
prompt. Pages already in the conversation stay where they are; a later turn lists only the
pages it adds.

Laying out turn t (`turn_layout`, the last turn given is the one asked) decides which rows are
its own: everything up to the end of answer t - 1 and the opening of turn t (the same tokens
whatever turn t asks) is the layout's `head` (the conversation's prefix, exact or rebuilt by
the caller); its segments and labels are those of the pages turn t
adds (labels as text rows, computed fresh: they are short and follow the conversation).
Positions come from the family's own rule over the whole sequence, so a prefix keeps its
positions when the conversation grows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.prompt.layout import Layout, Segment, build_layout


@dataclass(frozen=True)
class TurnText:
    """One turn's tokens: the pages it adds (labels, segment token ids, grids), its question
    and, once answered, its answer text."""

    labels: list[str]
    segments: list[torch.Tensor]  # each (T_i,) int64 page token ids
    image_grids: list[torch.Tensor]
    question: str
    answer: str | None = None


def _pieces(adapter: VLMAdapter, prefix: str, turns: list[TurnText]) -> tuple[
        list[torch.Tensor], list[tuple[int, int, int]], list[tuple[int, int, int]], int]:
    """Token pieces of `turns` in order; the (start, length, turn) of every page label and
    segment; the start of the last turn's question."""
    pieces = [torch.tensor(adapter.head_ids(prefix), dtype=torch.long)]
    cursor = int(pieces[0].shape[0])
    labels: list[tuple[int, int, int]] = []
    spans: list[tuple[int, int, int]] = []
    question_start = cursor
    for t, turn in enumerate(turns):
        if t:
            opening = torch.tensor(adapter.page_opening_ids(), dtype=torch.long)
            pieces.append(opening)
            cursor += int(opening.shape[0])
        for label, seg in zip(turn.labels, turn.segments, strict=True):
            lab = torch.tensor(adapter.label_ids(label), dtype=torch.long)
            pieces += [lab, seg.to(torch.long).cpu()]
            if lab.numel():
                labels.append((cursor, int(lab.shape[0]), t))
            cursor += int(lab.shape[0])
            spans.append((cursor, int(seg.shape[0]), t))
            cursor += int(seg.shape[0])
        question_start = cursor
        tail = torch.tensor(adapter.tail_ids(turn.question), dtype=torch.long)
        pieces.append(tail)
        cursor += int(tail.shape[0])
        if turn.answer is not None:
            answer = torch.tensor(adapter.answer_ids(turn.answer), dtype=torch.long)
            pieces.append(answer)
            cursor += int(answer.shape[0])
    return pieces, labels, spans, question_start


def history_ids(adapter: VLMAdapter, prefix: str, turns: list[TurnText]) -> torch.Tensor:
    """Token ids (P,) of answered `turns` laid out as a conversation and the opening of the
    next user turn: the prefix a next turn starts from."""
    opening = torch.tensor(adapter.page_opening_ids(), dtype=torch.long)
    return torch.cat([*_pieces(adapter, prefix, turns)[0], opening])


def turn_layout(adapter: VLMAdapter, prefix: str, turns: list[TurnText]) -> Layout:
    """The layout of the conversation when its last turn (unanswered) is asked. With one
    turn it is `build_layout`'s (stale labels left to the caller); with more, `head` is the
    prefix of the answered turns (`history_ids`) and the segments and labels are the last
    turn's pages (page i its i-th), its labels text rows."""
    *done, asked = turns
    if asked.answer is not None or any(t.answer is None for t in done):
        raise ValueError("every turn but the last must be answered, and the last not")
    if not done:
        return build_layout(adapter, prefix, asked.labels, asked.segments, asked.image_grids,
                            asked.question)
    pieces, labels, spans, question_start = _pieces(adapter, prefix, turns)
    ids = torch.cat(pieces)  # (N,)
    grids = [g for t in turns for g in t.image_grids]
    pos = adapter.position_ids(ids, grids).cpu()  # (P, N)
    last = len(turns) - 1
    own = [s for s in spans if s[2] == last]
    segments = [Segment(start, length, i) for i, (start, length, _) in enumerate(own)]
    own_labels = [(start, length) for start, length, t in labels if t == last]
    label_pages = [i for i, (start, _, _) in enumerate(own)
                   if any(ls + ll == start for ls, ll in own_labels)]
    label_spans = [Segment(start, length, page)
                   for (start, length), page in zip(own_labels, label_pages, strict=True)]
    head = int(history_ids(adapter, prefix, done).shape[0])
    return Layout(token_ids=ids, position_ids=pos, segments=segments,
                  question_start=question_start, head=head, prompt=len(adapter.tail_ids("")),
                  labels=label_spans)
