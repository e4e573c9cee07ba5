"""The refresh pass: recompute the chosen visual rows and the text rows of an assembled
cache, reusing every row whose result is already exact.

Which rows a refresh computes (`refresh_rows`) is decided here once, for the pass and for
the cost model that predicts it (`conduit_core.cost.cost_model`); a policy that already ran
every token through the first layers hands the pass a `Resume` to start from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.layer_forward import forward_rows, setup_rows
from conduit_core.passes.stale_pass import text_from_layer_one
from conduit_core.prompt.layout import Layout


@dataclass(frozen=True)
class Resume:
    """Every token's hidden state after decoder layers 0..layer - 1, with fresh K/V of every
    token written at those layers: the refresh runs its rows from `layer` on."""

    layer: int  # first layer still to run
    hidden: torch.Tensor  # (N, hidden) input of `layer`, all rows in sequence order


def refresh_rows(layout: Layout, exact_rows: int, visual_rows: torch.Tensor,
                 scored: bool) -> tuple[torch.Tensor, int]:
    """Rows a refresh computes, ascending: text rows after the cached head plus `visual_rows`
    (and the stale labels of the pages they cover whole, `Layout.refreshed_label_rows`);
    after a scoring pass the text rows before the first refreshed cached row are exact
    already and skipped. Returns (rows, how many text rows were skipped after the head)."""
    visual_rows = visual_rows.to(torch.long).cpu()
    stale = torch.cat([visual_rows, layout.refreshed_label_rows(visual_rows)])  # (V',)
    rows = torch.cat([layout.text_rows(), stale]).unique(sorted=True)  # (R,)
    rows = rows[rows >= exact_rows]
    if not scored:
        return rows, 0
    first = int(stale.min()) if stale.numel() else layout.n
    skipped = int((rows < first).sum())  # every row before `first` is a text row
    return rows[skipped:], skipped


@torch.no_grad()
def refresh_pass(adapter: VLMAdapter, assembly: Assembly, visual_rows: torch.Tensor,
                 resume: Resume | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Recompute `visual_rows` and all text rows after the head in sequence order, writing
    their K/V; returns their last-layer hidden states in row order and the rows it actually
    computed (R_c,).

    Head rows are exact from the head cache. Text row t's stale-pass result is exact when
    every key before t is as the refresh will leave it: text rows before t (by
    induction) and unselected visual rows (stale in both passes). So the text rows before
    the first refreshed visual row are reused from the scoring pass, provided it ran on
    this cache and nothing wrote since; the other text rows start at layer 1 from the
    scoring pass's layer-0 output (exact: `conduit_core.passes.stale_pass.text_from_layer_one`),
    the visual rows at layer 0. With `resume` (a policy already ran every token
    through the first layers), the rows start from its hidden states at layer
    `resume.layer`. With `assembly.last_only` only the last row's state is returned."""
    layout = assembly.layout
    stale = assembly.stale
    scored = (stale is not None and stale.text_hidden is not None
              and assembly.stale_writes == assembly.cache.writes)
    rows, skipped = refresh_rows(layout, assembly.exact_rows, visual_rows, scored)
    everything = rows.numel() == layout.n
    reused: list[torch.Tensor] = []  # last-layer states of the rows not computed
    if not assembly.last_only:
        if assembly.head is not None:
            reused.append(assembly.head.hidden)
        if scored and stale is not None and stale.text_hidden is not None:
            reused.append(stale.text_hidden[:skipped])
    if rows.numel() == 0:
        if assembly.last_only:
            assert stale is not None and stale.text_hidden is not None
            return stale.text_hidden[-1:], rows  # the last row is a text row
        return torch.cat(reused), rows
    assembly.text_from_one = (scored and resume is None and assembly.layer0_exact
                              and stale is not None
                              and stale.after_first is not None)
    pos = layout.position_ids[:, rows].unsqueeze(1)  # (P, 1, R)
    setup = setup_rows(adapter, assembly.embeds.dtype, rows, pos, n_keys=layout.n,
                       plain_causal=everything)
    if assembly.text_from_one:
        assert stale is not None
        hidden = text_from_layer_one(adapter, assembly.cache, stale, assembly.embeds,
                                     layout.position_ids, rows, layout.n,
                                     setup)  # (1, R, hidden)
    else:
        start = assembly.embeds if resume is None else resume.hidden  # (N, hidden)
        hidden = start[rows.to(start.device)].unsqueeze(0)  # (1, R, hidden)
    first = 1 if assembly.text_from_one else 0 if resume is None else resume.layer
    layers = range(first, len(adapter.layers))
    outputs = torch.tensor([rows.numel() - 1]) if assembly.last_only else None
    out = forward_rows(adapter, assembly.cache, hidden, rows, pos, n_keys=layout.n,
                       plain_causal=everything, layers=layers, outputs=outputs,
                       setup=setup)[0]  # (R_c | 1, hidden)
    if reused:
        out = torch.cat([*(r.to(out.dtype) for r in reused), out])  # (R, hidden)
    return out, rows
