"""Training and evaluation tensors for the testbed, in the layout the service assembles.

A sample is one question over a subset of a document's pages: the pages the answer needs plus
distractor pages of the same document up to `Shape.shown` pages, in document order (the
service's reading order within a document), each preceded by the service's page
label and the whole prompt under the service's answer prefix (`worker.prompt`), laid out
by the runtime's own `build_layout`. Page pixels come from a per-glyph table of patch vectors
taken from the model's image processor, so no image is resized or normalised per step.

Public API:
  GlyphPatches(processor)          .page_pixels(rows) -> (cells * 4, C * tp * p * p) float32
                                   .page_cells(rows) -> (cells,) glyph indices into .table
  Sample(doc, question, pages, doc_name)     one question; .labels(), .text
  draw_sample(rng, shape, follow_ups, shown=None, pair_share=None) -> Sample
  Batch(ids, position_ids, cells, table, grids, targets)   .pixel_values; targets: triples
  Layouts(adapter, shape)          memoised build_layout of samples
  make_batch(samples, layouts, patches) -> Batch
  page_image(rows) -> PIL.Image    the page as the ingest path renders it
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.prompt.layout import build_layout
from lab.testbed.glyphs import ALPHABET, draw_grid
from lab.testbed.task import FAMILIES, PAGE, Document, Question, Record, Shape, make_document
from worker.prompt import ANSWER_PREFIX


def page_image(rows: list[str]) -> Image.Image:
    """The page drawn as an RGB image (identical to the PDF rendered at the default dpi)."""
    return Image.fromarray(draw_grid(rows))


class GlyphPatches:
    """Patch vectors of each glyph cell, read off the processor's output for one glyph row."""

    def __init__(self, processor: object):
        ip = processor.image_processor  # type: ignore[attr-defined]
        strip = Image.fromarray(draw_grid([ALPHABET]))
        area = strip.width * strip.height
        out = ip(images=[strip], return_tensors="pt",
                 size={"shortest_edge": area, "longest_edge": area})
        pv = out["pixel_values"]  # (cells * 4, C * tp * p * p): 2 x 2 patches per cell
        assert tuple(out["image_grid_thw"][0].tolist()) == (1, 2, 2 * len(ALPHABET))
        self.table = pv.view(len(ALPHABET), 4, -1)  # (glyphs, 4, D)
        self.index = {ch: i for i, ch in enumerate(ALPHABET)}

    def page_cells(self, rows: list[str]) -> torch.Tensor:
        """Each cell's glyph index into `table`, (cells,) int64, cells in raster order."""
        return torch.tensor([self.index[ch] for line in rows for ch in line])

    def page_pixels(self, rows: list[str]) -> torch.Tensor:
        """The processor's pixel_values of a page, (cells * 4, D), cells in raster order."""
        return self.table[self.page_cells(rows)].reshape(-1, self.table.shape[-1])


@dataclass
class Sample:
    """One question over some of the document's pages (0-based, sorted)."""

    doc: Document
    question: Question
    pages: list[int]
    doc_name: str
    follow_ups: list[Question] = field(default_factory=list)  # later turns (training only)

    @property
    def text(self) -> str:
        """The question text."""
        return self.question.text

    def labels(self) -> list[str]:
        """The service's page labels."""
        return [f"[{self.doc_name} p.{p + 1}]" for p in self.pages]


def shown_pages(doc: Document, needed: set[int], k: int, rng: random.Random) -> list[int]:
    """The pages `needed` (0-based) plus distractors of `doc` drawn by `rng`, `k` in all (or
    every page), in document order."""
    others = [p for p in range(len(doc.pages)) if p not in needed]
    extra = rng.sample(others, max(0, min(len(others), k - len(needed))))
    return sorted(needed | set(extra))


def draw_sample(rng: random.Random, shape: Shape = PAGE, follow_ups: int = 0,
                shown: int | None = None, pair_share: float | None = None) -> Sample:
    """A random document, a question of a uniformly drawn family (with `pair_share`: the
    pair family with that probability, the others uniformly), and the pages shown (its
    evidence plus distractors: `shown` pages in all, else a count drawn from `shape.shown`);
    with `follow_ups`, as many more one-record questions (later chat turns) answerable from
    those pages."""
    doc = make_document(rng, shape)
    if pair_share is None:  # the recipe's draw (the same random stream as before the option)
        family = rng.choice(FAMILIES)
    else:
        if not 0.0 <= pair_share <= 1.0:
            raise ValueError(f"pair_share must be in [0, 1], got {pair_share}")
        others = [f for f in FAMILIES if f != "pair"]
        family = "pair" if rng.random() < pair_share else rng.choice(others)
    question = doc.question(family, rng)
    pages = shown_pages(doc, question.evidence_indices,
                        shown or rng.randint(*shape.shown), rng)
    sample = Sample(doc, question, pages, f"t{rng.randrange(1000):03d}.pdf")
    if follow_ups:
        asked = set(question.records)
        answerable = [r for r in doc.records if r not in asked
                      and all(p - 1 in pages for p in r.evidence_pages)]
        sample.follow_ups = [Question((r,), r.family)
                             for r in rng.sample(answerable, min(follow_ups, len(answerable)))]
    return sample


@dataclass
class Batch:
    """Right-padded token ids (B, N), positions (3, B, N), pixels and loss targets.

    Pixels travel as glyph indices plus the glyph table and are gathered where they are used
    (on the device): a step's pixel values are hundreds of MB, its indices a few kB."""

    ids: torch.Tensor
    position_ids: torch.Tensor
    cells: torch.Tensor  # (pages * cells,) int64: each shown cell's glyph, pages in order
    table: torch.Tensor  # (glyphs, 4, D): `GlyphPatches.table`
    grids: torch.Tensor  # (pages, 3)
    aux: torch.Tensor  # (A, 3) int64: batch row, sequence index, target token
    glyphs: torch.Tensor  # (G, 3) int64: every cell's own glyph (batch row, index, token)
    answer: torch.Tensor  # (T, 3) int64: batch row, index of the logit, target token
    answer_end: torch.Tensor  # (T,) bool: the target is the end-of-turn token
    follow: torch.Tensor  # (F, 3) int64: the same for follow-up turns
    ask: torch.Tensor  # (Q, 3) int64: each question's key token -> its answer (training aid)
    look_q: torch.Tensor  # (L, 3) int64: batch row, question position, its key cell's position
    look_p: torch.Tensor  # (R, 3) int64: batch row, a key cell, the cell on another page it reads
    held: torch.Tensor  # (H, 3) int64: batch row, a key cell, what it names early (`_held`)

    @property
    def pixel_values(self) -> torch.Tensor:
        """The processor's pixel_values of every shown page, (pages * cells * 4, D)."""
        return self.table[self.cells].reshape(-1, self.table.shape[-1])


class Layouts:
    """`build_layout` for testbed samples, memoised: token pieces by text, position ids by the
    pieces' lengths (which are all that Qwen2-VL's M-RoPE index depends on for fixed grids)."""

    def __init__(self, adapter: VLMAdapter, shape: Shape = PAGE):
        self.adapter, self.shape = adapter, shape
        self.grid = torch.tensor([1, 2 * shape.rows, 2 * shape.cols])
        self.segment = torch.tensor(
            [adapter.vision_start_id] + [adapter.image_token_id] * shape.cells  # type: ignore[attr-defined]
            + [adapter.vision_end_id])  # type: ignore[attr-defined]
        self._labels: dict[str, torch.Tensor] = {}
        self._tails: dict[str, torch.Tensor] = {}
        self._turns: dict[str, torch.Tensor] = {}
        self._positions: dict[tuple[int, ...], tuple[torch.Tensor, list[int], int]] = {}
        self.head = torch.tensor(adapter.head_ids(ANSWER_PREFIX))
        tok = adapter.tokenizer
        self._tokens = {ch: int(tok(ch, add_special_tokens=False).input_ids[-1])
                        for ch in ALPHABET}
        self._question_mark = int(tok("?", add_special_tokens=False).input_ids[-1])
        self._and = int(tok(" and", add_special_tokens=False).input_ids[-1])
        self.end_id = int(tok.convert_tokens_to_ids("<|im_end|>"))

    def turn(self, text: str) -> torch.Tensor:
        """A follow-up chat turn asking `text`, up to the generation prompt."""
        if text not in self._turns:
            ids = (self.adapter.tokenizer("<|im_end|>\n<|im_start|>user\n",
                                          add_special_tokens=False).input_ids
                   + self.adapter.tail_ids(text))
            self._turns[text] = torch.tensor(ids, dtype=torch.long)
        return self._turns[text]

    def key_indices(self, ids: torch.Tensor, n_keys: int) -> list[int]:
        """Indices in `ids` of the last question's key tokens: the one just before its "?"
        ("K", or " M" where the tokenizer merges the space into the letter) and, for two
        keys, the one just before " and"."""
        mark = int((ids[1:] == self._question_mark).nonzero()[-1, 0])
        if n_keys == 1:
            return [mark]
        ands = (ids[1:mark + 1] == self._and).nonzero()  # (k, 1)
        return [int(ands[-1, 0]), mark]

    def token_of(self, ch: str) -> int:
        """The vocabulary id a glyph is named by (a space for the blank cell)."""
        return self._tokens[ch]

    def answer_ids(self, question: Question) -> list[int]:
        """The answer's tokens, one per character ("5 7": digit, space, digit; no merges)."""
        return [self.token_of(ch) for ch in question.answer]

    def _piece(self, memo: dict[str, torch.Tensor], text: str, ids: list[int]) -> torch.Tensor:
        if text not in memo:
            memo[text] = torch.tensor(ids, dtype=torch.long)
        return memo[text]

    def layout(self, sample: Sample) -> tuple[torch.Tensor, torch.Tensor, list[int], int]:
        """(token ids (N,), position ids (3, N), segment starts, next position)."""
        labels = [self._labels[t] if t in self._labels else self._piece(
            self._labels, t, self.adapter.label_ids(t)) for t in sample.labels()]
        q = sample.text
        tail = self._tails.get(q)
        if tail is None:
            tail = self._piece(self._tails, q, self.adapter.tail_ids(q))
        pieces = [self.head]
        for lab in labels:
            pieces += [lab, self.segment]
        pieces.append(tail)
        ids = torch.cat(pieces)  # (N,)
        key = tuple(int(p.shape[0]) for p in pieces)
        if key not in self._positions:
            layout = build_layout(self.adapter, ANSWER_PREFIX, sample.labels(),
                                  [self.segment] * len(labels), [self.grid] * len(labels), q)
            assert torch.equal(layout.token_ids, ids)
            self._positions[key] = (layout.position_ids, [s.start for s in layout.segments],
                                    layout.next_position())
        pos, starts, nxt = self._positions[key]
        return ids, pos, starts, nxt


def _held(doc: Document, record: Record) -> str:
    """What a key cell names early from its own row: a lookup's value, a legend record's
    letter (its digit is fetched as a lookup's is; the letter, without this target, was not:
    under "#2" the model answered some letter, rarely the row's)."""
    if record.family == "lookup":
        return record.answer
    return doc.pages[record.page][record.cell // doc.shape.cols][record.cell % doc.shape.cols - 2]


class _Targets:
    """Loss targets of one batch, collected sample by sample."""

    def __init__(self) -> None:
        self.aux: list[tuple[int, int, int]] = []
        self.glyphs: list[tuple[int, int, int]] = []
        self.answer: list[tuple[int, int, int]] = []
        self.answer_end: list[bool] = []
        self.follow: list[tuple[int, int, int]] = []
        self.ask: list[tuple[int, int, int]] = []
        self.look_q: list[tuple[int, int, int]] = []
        self.look_p: list[tuple[int, int, int]] = []
        self.held: list[tuple[int, int, int]] = []

    def turn(self, layouts: Layouts, b: int, ids: torch.Tensor, offset: int, q: Question,
             cell_at: dict[str, int], first: bool) -> list[int]:
        """Targets of one question whose tokens `ids` start at `offset` in row `b`: its key
        tokens and answer positions look at the key cells and name the values; returns the
        answer tokens that follow it in the row."""
        answer = layouts.answer_ids(q)
        keys = layouts.key_indices(ids, len(q.records))
        n = offset + int(ids.shape[0])  # index of the first answer token
        for r, k in zip(q.records, keys, strict=True):
            self.ask.append((b, offset + k, layouts.token_of(r.answer)))
            self.look_q.append((b, offset + k, cell_at[r.key]))
        for i, r in enumerate(q.records):  # the logit row that names each value
            self.look_q.append((b, n - 1 + 2 * i, cell_at[r.key]))
        rows = [(b, n - 1 + i, t) for i, t in enumerate([*answer, layouts.end_id])]
        if first:
            self.answer += rows
            self.answer_end += [False] * len(answer) + [True]
        else:
            self.follow += rows
        return answer


def make_batch(samples: list[Sample], layouts: Layouts, patches: GlyphPatches) -> Batch:
    """Lay out every sample as the service would and collect its targets."""
    tok = layouts.adapter.tokenizer
    cols = layouts.shape.cols
    t = _Targets()
    rows_ids, rows_pos, cells = [], [], []
    for b, s in enumerate(samples):
        ids, pos, starts, nxt = layouts.layout(s)
        start_of = dict(zip(s.pages, starts, strict=True))
        cell_at = {r.key: start_of[r.page] + 1 + r.cell for r in s.doc.records
                   if r.page in start_of}  # sequence index of each shown key cell
        answer = t.turn(layouts, b, ids, 0, s.question, cell_at, first=True)
        pieces = [ids, torch.tensor(answer)]
        n = int(ids.shape[0]) + len(answer)
        for q in s.follow_ups:  # <|im_end|>\n<|im_start|>user\n question ... assistant\n value
            turn = layouts.turn(q.text)
            answer = t.turn(layouts, b, turn, n, q, cell_at, first=False)
            pieces += [turn, torch.tensor(answer)]
            n += int(turn.shape[0]) + len(answer)
        row = torch.cat(pieces)  # (N',)
        text = torch.arange(nxt, nxt + int(row.shape[0]) - int(pos.shape[1]))
        rows_ids.append(row)
        rows_pos.append(torch.cat([pos, text.view(1, -1).expand(3, -1)], dim=1))  # (3, N')
        for r in s.doc.records:  # key cells: look at what they need elsewhere, or hold a value
            src = s.doc.source(r)
            if r.page in start_of and src is not None and src[0] in start_of:
                t.look_p.append((b, cell_at[r.key], start_of[src[0]] + 1 + src[1]))
            if r.page in start_of and r.family in ("lookup", "legend"):
                t.held.append((b, cell_at[r.key], layouts.token_of(_held(s.doc, r))))
        for start, page in zip(starts, s.pages, strict=True):
            cells.append(patches.page_cells(s.doc.pages[page]))
            for cell, ch in s.doc.aux_targets(page, s.pages):
                t.aux.append((b, start + 1 + cell, layouts.token_of(ch)))
            t.glyphs += [(b, start + 1 + cell, layouts.token_of(ch))
                         for cell, ch in enumerate("".join(s.doc.pages[page]))]
    assert cols * layouts.shape.rows == int(layouts.segment.shape[0]) - 2
    n_max = max(int(x.shape[0]) for x in rows_ids)
    ids_t = torch.full((len(samples), n_max), int(tok.pad_token_id), dtype=torch.long)  # (B, N)
    pos_t = torch.zeros(3, len(samples), n_max, dtype=torch.long)  # (3, B, N)
    for b, (ids, pos) in enumerate(zip(rows_ids, rows_pos, strict=True)):
        ids_t[b, :ids.shape[0]] = ids
        pos_t[:, b, :ids.shape[0]] = pos
    n_pages = sum(len(s.pages) for s in samples)

    def triples(x: list[tuple[int, int, int]]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long).view(-1, 3)

    return Batch(ids=ids_t, position_ids=pos_t, cells=torch.cat(cells), table=patches.table,
                 grids=layouts.grid.view(1, 3).repeat(n_pages, 1),
                 aux=triples(t.aux), glyphs=triples(t.glyphs), answer=triples(t.answer),
                 answer_end=torch.tensor(t.answer_end, dtype=torch.bool),
                 follow=triples(t.follow), ask=triples(t.ask), look_q=triples(t.look_q),
                 look_p=triples(t.look_p), held=triples(t.held))


def batch_hidden(model: Any, batch: Batch, layers: bool = False
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """Last-layer hidden states (B, N, hidden) of a batch, vision tower included (without a
    graph when its parameters are frozen), and with
    `layers` the residual stream after each decoder layer (entry L + 1 after layer L), else
    None."""
    inner = model.model
    embeds = inner.language_model.embed_tokens(batch.ids)  # (B, N, hidden)
    train_vision = any(p.requires_grad for p in inner.visual.parameters())
    with torch.set_grad_enabled(torch.is_grad_enabled() and train_vision):  # frozen: no graph
        feats = inner.get_image_features(batch.pixel_values, batch.grids,
                                         return_dict=True).pooler_output
    feats = torch.cat(list(feats)) if isinstance(feats, list | tuple) else feats
    mask = batch.ids == inner.config.image_token_id  # (B, N)
    embeds = embeds.masked_scatter(mask.unsqueeze(-1), feats.to(embeds.dtype))
    out = inner.language_model(inputs_embeds=embeds, position_ids=batch.position_ids,
                               use_cache=False, output_hidden_states=layers)
    return out.last_hidden_state, (out.hidden_states if layers else None)
