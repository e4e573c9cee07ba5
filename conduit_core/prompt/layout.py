"""The token layout of an assembled request and of a canonical page context.

A request is `[head(prefix) | (label text, page segment)* | tail(question)]`; text pieces
are tokenized separately (segments are delimited by special tokens), so the layout is exactly
the concatenation. Positions come from the family's own rule over the whole layout. A page's
canonical context (`page_context`), where it is prefilled once, is the layout of that page
alone.

Labels are text rows, computed in every pass, unless the layout has `stale_labels`: then a
label's K/V come from the label cache (`conduit_core.label_cache`), stale like its page's,
and `label_refresh` says which labels a refresh recomputes (`refreshed_label_rows`): "page"
a label only with its whole page; "always" every label whatever it refreshes of the pages
(the scoring pass still reads them stale) but the first when it directly follows the head,
unless its page is refreshed whole: the label cache computed it in that exact context, so
it is not stale; "budget" the same labels as "always", their rows counted against the
refresh budget (`budget_label_rows`, taken off the visual tokens by `PolicyContext.k`);
"read", after a scoring pass, only the `read_labels` stale labels whose keys the question
reads most (`read_label_rows`: chosen from the scores on their device, never read back), and
without one (no scores to choose from) the same labels as "always".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
import torch

from conduit_core.model.adapters.base import VLMAdapter

LabelRefresh = Literal["page", "always", "budget", "read"]
LABEL_REFRESH: tuple[LabelRefresh, ...] = get_args(LabelRefresh)
READ_LABELS = 2  # the stale labels a scored refresh recomputes under "read"


@dataclass(frozen=True)
class Segment:
    """Span [start, start + length) of page `page` in the layout."""

    start: int
    length: int
    page: int

    @property
    def stop(self) -> int:
        """One past the segment's last index."""
        return self.start + self.length


@dataclass
class Layout:
    """Token ids, position ids and page spans of one sequence."""

    token_ids: torch.Tensor  # (N,) int64
    position_ids: torch.Tensor  # (P, N) int64
    segments: list[Segment]
    question_start: int  # first index of the tail (question + generation prompt)
    head: int = 0  # tokens of the head (template opening + prefix): rows [0, head)
    prompt: int = 0  # the generation prompt's tokens, last in the tail (after the question)
    labels: list[Segment] = field(default_factory=list)  # page i's label span, page order
    stale_labels: bool = False  # labels come from the label cache, stale like their pages
    label_refresh: LabelRefresh = "page"  # with stale_labels: which labels a refresh recomputes
    read_labels: int = READ_LABELS  # with "read": how many stale labels a scored refresh takes

    @property
    def n(self) -> int:
        """Sequence length."""
        return int(self.token_ids.shape[0])

    def segment_mask(self) -> torch.Tensor:
        """(N,) bool, True at page segment (cached, "visual") tokens. Built on the host in
        numpy, like the other row sets here: bookkeeping, never device work."""
        return torch.from_numpy(_spans_mask(self.n, self.segments))

    def cached_mask(self) -> torch.Tensor:
        """(N,) bool, True at rows filled from caches before any pass: page segments, and
        page labels when they are stale."""
        spans = self.segments + self.labels if self.stale_labels else self.segments
        return torch.from_numpy(_spans_mask(self.n, spans))

    def refreshed_label_rows(self, visual_rows: torch.Tensor) -> torch.Tensor:
        """Stale label rows a refresh of `visual_rows` recomputes, ascending: the labels of
        the pages it refreshes whole, and unless `label_refresh` is "page" every other label
        but one right after the head (exact as cached; none unless `stale_labels`). Under
        "read" these are a refresh's without a scoring pass (`read_label_rows` after one)."""
        every = self.label_refresh != "page"
        if not self.stale_labels or (visual_rows.numel() == 0 and not every):
            return torch.zeros(0, dtype=torch.long)
        chosen = np.zeros(self.n, dtype=bool)
        chosen[visual_rows.to(torch.long).cpu().numpy()] = True
        whole = {s.page for s in self.segments if bool(chosen[s.start:s.stop].all())}
        stale = {s.start for s in self._stale_labels()} if every else set()
        return _span_rows([s for s in self.labels if s.page in whole or s.start in stale])

    def _stale_labels(self) -> list[Segment]:
        """The labels whose cached K/V are stale: all but one right after the head, which
        was cached in its exact context (the head alone precedes it)."""
        return [s for s in self.labels if s.start != self.head]

    def read_label_count(self) -> int:
        """Rows `read_label_rows` returns: those of the `read_labels` longest stale labels
        (0 unless `stale_labels`), known on the host whatever the scores choose."""
        if not self.stale_labels:
            return 0
        lengths = sorted((s.length for s in self._stale_labels()), reverse=True)
        return sum(lengths[:max(0, self.read_labels)])

    def read_label_rows(self, weighted: torch.Tensor | None = None) -> torch.Tensor:
        """The stale label rows a refresh after a scoring pass recomputes under "read",
        ascending, `read_label_count` of them: the labels ranked by the scores `weighted`
        (N,) summed over each label's rows (the key mass the scored rows read there; ties
        to the earlier label), their rows taken in rank order, on the scores' device with
        nothing read back. Where lengths differ, the count can end inside the next label
        (a subset of a label is recomputed: exact as any subset). Without `weighted` (a
        prediction before the pass) the ranking spreads `read_labels` labels evenly."""
        stale = self._stale_labels() if self.stale_labels else []
        count = self.read_label_count()
        if count == 0:
            return torch.zeros(0, dtype=torch.long)
        index = torch.from_numpy(_span_table(stale))  # (S, W) rows, -1 past a label's end
        if weighted is not None:  # the scores' device (the guess stays on the host)
            index = index.to(weighted.device)
        else:  # the prediction's stand-in for the scores
            picks = np.linspace(0, len(stale) - 1, min(self.read_labels, len(stale)))
            weighted = torch.from_numpy(
                _spans_mask(self.n, [stale[int(i)] for i in np.round(picks)]).astype(np.float32))
        mass = (weighted[index.clamp(min=0)] * (index >= 0)).sum(1)  # (S,) read per label
        order = torch.argsort(mass, descending=True, stable=True)  # (S,) most read first
        ranked = index[order].reshape(-1)  # (S * W,) label rows in rank order, -1 gaps
        slot = torch.ones_like(ranked).cumsum(0) - 1  # (S * W,) 0, 1, ... beside `ranked`
        first = torch.argsort(torch.where(ranked >= 0, slot, slot + ranked.numel()))  # (S * W,)
        return torch.sort(ranked[first[:count]]).values  # (C,)

    def budget_label_rows(self) -> int:
        """Label rows every refresh recomputes that count against its budget (0 unless
        `stale_labels` and `label_refresh` "budget")."""
        if not (self.stale_labels and self.label_refresh == "budget"):
            return 0
        return sum(s.length for s in self._stale_labels())

    def visual_rows(self) -> torch.Tensor:
        """Sequence indices of page segment tokens, ascending (N_v,)."""
        return torch.nonzero(self.segment_mask()).view(-1)

    def page_of_visual(self) -> torch.Tensor:
        """Page number of each visual token, aligned with `visual_rows` (N_v,) int64; made on
        the host in numpy (bookkeeping, like the row sets)."""
        pages = np.array([s.page for s in self.segments], dtype=np.int64)  # (M,)
        lengths = np.array([s.length for s in self.segments], dtype=np.int64)  # (M,)
        return torch.from_numpy(np.repeat(pages, lengths))  # (N_v,)

    def label_rows(self) -> torch.Tensor:
        """Sequence indices of every page label's tokens, ascending (N_l,)."""
        return _span_rows(self.labels)

    def text_rows(self) -> torch.Tensor:
        """Sequence indices of text tokens (always computed fresh: every row not filled
        from a cache), ascending (N_t,)."""
        return torch.nonzero(~self.cached_mask()).view(-1)

    def question_rows(self) -> torch.Tensor:
        """Sequence indices of the tail (question + generation prompt), ascending."""
        return torch.arange(self.question_start, self.n)

    def next_position(self) -> int:
        """Position of the first generated token: one past the largest position."""
        return int(self.position_ids.max()) + 1


def _spans_mask(n: int, spans: list[Segment]) -> np.ndarray:
    """(n,) bool numpy, True inside `spans`."""
    mask = np.zeros(n, dtype=bool)
    for s in spans:
        mask[s.start:s.stop] = True
    return mask


def _span_table(spans: list[Segment]) -> np.ndarray:
    """(len(spans), longest) int64 numpy: row i holds span i's rows, then -1."""
    table = np.full((len(spans), max(s.length for s in spans)), -1, dtype=np.int64)
    for i, s in enumerate(spans):
        table[i, :s.length] = np.arange(s.start, s.stop)
    return table


def _span_rows(spans: list[Segment]) -> torch.Tensor:
    """The rows of `spans` in order, (sum of lengths,) int64, made on the host."""
    if not spans:
        return torch.zeros(0, dtype=torch.long)
    return torch.from_numpy(np.concatenate([np.arange(s.start, s.stop) for s in spans]))


def build_layout(
    adapter: VLMAdapter,
    prefix: str,
    labels: list[str],
    segments: list[torch.Tensor],
    image_grids: list[torch.Tensor],
    question: str,
    stale_labels: bool = False,
    label_refresh: LabelRefresh = "page",
) -> Layout:
    """Lay out `[head(prefix) | (label_i, segment_i)* | tail(question)]` with positions."""
    pieces: list[torch.Tensor] = [torch.tensor(adapter.head_ids(prefix), dtype=torch.long)]
    spans: list[Segment] = []
    label_spans: list[Segment] = []
    cursor = int(pieces[0].shape[0])
    for page, (label, seg) in enumerate(zip(labels, segments, strict=True)):
        lab = torch.tensor(adapter.label_ids(label), dtype=torch.long)
        pieces += [lab, seg.to(torch.long).cpu()]
        if lab.numel():
            label_spans.append(Segment(cursor, int(lab.shape[0]), page))
        cursor += int(lab.shape[0])
        spans.append(Segment(cursor, int(seg.shape[0]), page))
        cursor += int(seg.shape[0])
    tail = torch.tensor(adapter.tail_ids(question), dtype=torch.long)
    pieces.append(tail)
    ids = torch.cat(pieces)  # (N,)
    pos = adapter.position_ids(ids, image_grids).cpu()  # (P, N)
    return Layout(token_ids=ids, position_ids=pos, segments=spans, question_start=cursor,
                  head=int(pieces[0].shape[0]), prompt=len(adapter.tail_ids("")),
                  labels=label_spans, stale_labels=stale_labels, label_refresh=label_refresh)


def page_context(adapter: VLMAdapter, segment_ids: torch.Tensor,
                 image_grid: torch.Tensor) -> Layout:
    """The canonical page context: the template opening followed by the segment."""
    opening = torch.tensor(adapter.page_opening_ids(), dtype=torch.long)
    ids = torch.cat([opening, segment_ids.to(torch.long).cpu()])  # (N,)
    pos = adapter.position_ids(ids, [image_grid]).cpu()  # (P, N)
    seg = Segment(int(opening.shape[0]), int(segment_ids.shape[0]), 0)
    return Layout(token_ids=ids, position_ids=pos, segments=[seg], question_start=int(ids.shape[0]))
