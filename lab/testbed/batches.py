"""Training and evaluation tensors for the testbed, in the layout the service assembles.

A sample is one question over a subset of a document's pages: the pages the answer needs plus
each other page with probability 1/2, in document order, each preceded by the service's page
label and the whole prompt under the service's answer prefix (`worker.answer_job`), laid out
by the runtime's own `build_layout`. Page pixels come from a per-glyph table of patch vectors
taken from the model's image processor, so no image is resized or normalised per step.

Public API:
  GlyphPatches(processor)          .page_pixels(rows) -> (cells * 4, C * tp * p * p) float32
  Sample(doc, record, pages, doc_name)       one question; .labels(), .question
  draw_sample(rng) -> Sample
  Batch(ids, position_ids, pixel_values, grids, targets)   targets: (row, col, token) triples
  Layouts(adapter)                 memoised build_layout of samples
  make_batch(samples, layouts, patches) -> Batch
  page_image(rows) -> PIL.Image    the page as the ingest path renders it
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from conduit_core.adapters.base import VLMAdapter
from conduit_core.layout import build_layout
from lab.testbed.glyphs import ALPHABET, draw_grid
from lab.testbed.task import COLS, FAMILIES, ROWS, Document, Record, make_document, question_text
from worker.answer_job import ANSWER_PREFIX


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

    def page_pixels(self, rows: list[str]) -> torch.Tensor:
        """The processor's pixel_values of a page, (cells * 4, D), cells in raster order."""
        ids = torch.tensor([self.index[ch] for line in rows for ch in line])
        return self.table[ids].reshape(-1, self.table.shape[-1])


@dataclass
class Sample:
    """One question about one record, over some of the document's pages (0-based, sorted)."""

    doc: Document
    record: Record
    pages: list[int]
    doc_name: str
    follow_ups: list[Record] = field(default_factory=list)  # later turns (training only)

    @property
    def question(self) -> str:
        """The question text."""
        return question_text(self.record.key)

    def labels(self) -> list[str]:
        """The service's page labels."""
        return [f"[{self.doc_name} p.{p + 1}]" for p in self.pages]


def draw_sample(rng: random.Random, follow_ups: int = 0) -> Sample:
    """A random document, a record of a uniformly drawn family, and its page subset; with
    `follow_ups`, as many more questions (later chat turns) answerable from those pages."""
    doc = make_document(rng)
    family = rng.choice(FAMILIES)
    record = rng.choice([r for r in doc.records if r.family == family])
    needed = {p - 1 for p in record.evidence_pages}
    pages = sorted(p for p in range(len(doc.pages)) if p in needed or rng.random() < 0.5)
    sample = Sample(doc, record, pages, f"t{rng.randrange(1000):03d}.pdf")
    if follow_ups:
        answerable = [r for r in doc.records if r is not record
                      and all(p - 1 in pages for p in r.evidence_pages)]
        sample.follow_ups = rng.sample(answerable, min(follow_ups, len(answerable)))
    return sample


@dataclass
class Batch:
    """Right-padded token ids (B, N), positions (3, B, N), pixels and loss targets."""

    ids: torch.Tensor
    position_ids: torch.Tensor
    pixel_values: torch.Tensor
    grids: torch.Tensor  # (pages, 3)
    aux: torch.Tensor  # (A, 3) int64: batch row, sequence index, target token
    glyphs: torch.Tensor  # (G, 3) int64: every cell's own glyph (batch row, index, token)
    answer: torch.Tensor  # (2B, 3) int64: batch row, index of the logit, target token
    follow: torch.Tensor  # (F, 3) int64: the same for follow-up turns
    ask: torch.Tensor  # (Q, 3) int64: each question's key token -> its answer (training aid)
    look_q: torch.Tensor  # (L, 3) int64: batch row, question position, its key cell's position
    look_p: torch.Tensor  # (R, 3) int64: batch row, a key cell, the cell on another page it reads
    held: torch.Tensor  # (H, 3) int64: batch row, a key cell, what it names early (`_held`)


class Layouts:
    """`build_layout` for testbed samples, memoised: token pieces by text, position ids by the
    pieces' lengths (which are all that Qwen2-VL's M-RoPE index depends on for fixed grids)."""

    def __init__(self, adapter: VLMAdapter):
        self.adapter = adapter
        self.grid = torch.tensor([1, 2 * ROWS, 2 * COLS])
        self.segment = torch.tensor(
            [adapter.vision_start_id] + [adapter.image_token_id] * (ROWS * COLS)  # type: ignore[attr-defined]
            + [adapter.vision_end_id])  # type: ignore[attr-defined]
        self._labels: dict[str, torch.Tensor] = {}
        self._tails: dict[str, torch.Tensor] = {}
        self._turns: dict[str, torch.Tensor] = {}
        self._positions: dict[tuple[int, ...], tuple[torch.Tensor, list[int], int]] = {}
        self.head = torch.tensor(adapter.head_ids(ANSWER_PREFIX))
        self._tokens = {ch: int(adapter.tokenizer(ch, add_special_tokens=False).input_ids[-1])
                        for ch in ALPHABET}
        self._question_mark = int(adapter.tokenizer("?", add_special_tokens=False).input_ids[-1])

    def turn(self, key: str) -> torch.Tensor:
        """A follow-up chat turn asking about `key`, up to the generation prompt."""
        q = question_text(key)
        if q not in self._turns:
            ids = (self.adapter.tokenizer("<|im_end|>\n<|im_start|>user\n",
                                          add_special_tokens=False).input_ids
                   + self.adapter.tail_ids(q))
            self._turns[q] = torch.tensor(ids, dtype=torch.long)
        return self._turns[q]

    def key_index(self, ids: torch.Tensor) -> int:
        """Index in `ids` of the last question's key token: the one just before its "?"
        ("K", or " M" where the tokenizer merges the space into the letter)."""
        marks = (ids[1:] == self._question_mark).nonzero()  # (k, 1)
        return int(marks[-1, 0])

    def token_of(self, ch: str) -> int:
        """The vocabulary id a glyph is named by (a space for the blank cell)."""
        return self._tokens[ch]

    def _piece(self, memo: dict[str, torch.Tensor], text: str, ids: list[int]) -> torch.Tensor:
        if text not in memo:
            memo[text] = torch.tensor(ids, dtype=torch.long)
        return memo[text]

    def layout(self, sample: Sample) -> tuple[torch.Tensor, torch.Tensor, list[int], int]:
        """(token ids (N,), position ids (3, N), segment starts, next position)."""
        labels = [self._labels[t] if t in self._labels else self._piece(
            self._labels, t, self.adapter.label_ids(t)) for t in sample.labels()]
        q = sample.question
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
    return doc.pages[record.page][record.cell // COLS][1]


def make_batch(samples: list[Sample], layouts: Layouts, patches: GlyphPatches) -> Batch:
    """Lay out every sample as the service would and collect its targets."""
    tok = layouts.adapter.tokenizer
    end_id = int(tok.convert_tokens_to_ids("<|im_end|>"))
    rows_ids, rows_pos, pixels, aux, answer, glyphs = [], [], [], [], [], []
    follow: list[tuple[int, int, int]] = []
    ask: list[tuple[int, int, int]] = []
    look_q: list[tuple[int, int, int]] = []
    look_p: list[tuple[int, int, int]] = []
    held: list[tuple[int, int, int]] = []
    for b, s in enumerate(samples):
        ids, pos, starts, nxt = layouts.layout(s)
        start_of = dict(zip(s.pages, starts, strict=True))
        cell_at = {r.key: start_of[r.page] + 1 + r.cell for r in s.doc.records
                   if r.page in start_of}  # sequence index of each shown key cell
        n = int(ids.shape[0])
        ans_id = layouts.token_of(s.record.answer)
        answer += [(b, n - 1, ans_id), (b, n, end_id)]
        ask.append((b, layouts.key_index(ids), ans_id))
        look_q += [(b, layouts.key_index(ids), cell_at[s.record.key]),
                   (b, n - 1, cell_at[s.record.key])]
        pieces = [ids, torch.tensor([ans_id])]
        n += 1
        for r in s.follow_ups:  # <|im_end|>\n<|im_start|>user\n question ... assistant\n digit
            turn = layouts.turn(r.key)
            pieces += [turn, torch.tensor([layouts.token_of(r.answer)])]
            ask.append((b, n + layouts.key_index(turn), layouts.token_of(r.answer)))
            look_q += [(b, n + layouts.key_index(turn), cell_at[r.key]),
                       (b, n + int(turn.shape[0]) - 1, cell_at[r.key])]
            n += int(turn.shape[0]) + 1
            follow += [(b, n - 2, layouts.token_of(r.answer)), (b, n - 1, end_id)]
        row = torch.cat(pieces)  # (N',)
        text = torch.arange(nxt, nxt + int(row.shape[0]) - int(pos.shape[1]))
        rows_ids.append(row)
        rows_pos.append(torch.cat([pos, text.view(1, -1).expand(3, -1)], dim=1))  # (3, N')
        for r in s.doc.records:  # key cells: look at what they need elsewhere, or hold a value
            src = s.doc.source(r)
            if r.page in start_of and src is not None and src[0] in start_of:
                look_p.append((b, cell_at[r.key], start_of[src[0]] + 1 + src[1]))
            if r.page in start_of and r.family in ("lookup", "legend"):
                held.append((b, cell_at[r.key], layouts.token_of(_held(s.doc, r))))
        for start, page in zip(starts, s.pages, strict=True):
            pixels.append(patches.page_pixels(s.doc.pages[page]))
            for cell, ch in s.doc.aux_targets(page, s.pages):
                aux.append((b, start + 1 + cell, layouts.token_of(ch)))
            glyphs += [(b, start + 1 + cell, layouts.token_of(ch))
                       for cell, ch in enumerate("".join(s.doc.pages[page]))]
    n_max = max(int(x.shape[0]) for x in rows_ids)
    ids_t = torch.full((len(samples), n_max), int(tok.pad_token_id), dtype=torch.long)  # (B, N)
    pos_t = torch.zeros(3, len(samples), n_max, dtype=torch.long)  # (3, B, N)
    for b, (ids, pos) in enumerate(zip(rows_ids, rows_pos, strict=True)):
        ids_t[b, :ids.shape[0]] = ids
        pos_t[:, b, :ids.shape[0]] = pos
    n_pages = sum(len(s.pages) for s in samples)
    return Batch(ids=ids_t, position_ids=pos_t, pixel_values=torch.cat(pixels),
                 grids=layouts.grid.view(1, 3).repeat(n_pages, 1),
                 aux=torch.tensor(aux, dtype=torch.long),
                 glyphs=torch.tensor(glyphs, dtype=torch.long),
                 answer=torch.tensor(answer, dtype=torch.long),
                 follow=torch.tensor(follow, dtype=torch.long).view(-1, 3),
                 ask=torch.tensor(ask, dtype=torch.long),
                 look_q=torch.tensor(look_q, dtype=torch.long),
                 look_p=torch.tensor(look_p, dtype=torch.long).view(-1, 3),
                 held=torch.tensor(held, dtype=torch.long).view(-1, 3))


def batch_hidden(model: Any, batch: Batch, layers: bool = False,
                 attentions: list[torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """Last-layer hidden states (B, N, hidden) of a batch, vision tower included, and with
    `layers` the residual stream after each decoder layer (entry L + 1 after layer L), else
    None. With `attentions` (a list; the model in eager attention), each layer's attention
    probabilities (B, heads, N, N) are appended to it."""
    inner = model.model
    embeds = inner.language_model.embed_tokens(batch.ids)  # (B, N, hidden)
    feats = inner.get_image_features(batch.pixel_values, batch.grids,
                                     return_dict=True).pooler_output
    feats = torch.cat(list(feats)) if isinstance(feats, list | tuple) else feats
    mask = batch.ids == inner.config.image_token_id  # (B, N)
    embeds = embeds.masked_scatter(mask.unsqueeze(-1), feats.to(embeds.dtype))
    out = inner.language_model(inputs_embeds=embeds, position_ids=batch.position_ids,
                               use_cache=False, output_hidden_states=layers,
                               output_attentions=attentions is not None)
    if attentions is not None:
        attentions.extend(out.attentions)
    return out.last_hidden_state, (out.hidden_states if layers else None)
