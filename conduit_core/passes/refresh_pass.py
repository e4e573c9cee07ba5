"""The refresh pass: recompute the chosen visual rows and the text rows of an assembled
cache, reusing every row whose result is already exact.

Which rows a refresh computes (`refresh_rows`) is decided here once, for the pass and for
the cost model that predicts it (`conduit_core.cost.cost_model`); a policy that already ran
every token through the first layers hands the pass a `Resume` to start from.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import torch

from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.layer_forward import forward_rows_steps, setup_rows
from conduit_core.passes.layer_groups import layer_groups
from conduit_core.passes.stale_pass import text_from_layer_one
from conduit_core.prompt.layout import Layout


@dataclass(frozen=True)
class Resume:
    """Every token's hidden state after decoder layers 0..layer - 1, with fresh K/V of every
    token written at those layers: the refresh runs its rows from `layer` on."""

    layer: int  # first layer still to run
    hidden: torch.Tensor  # (N, hidden) input of `layer`, all rows in sequence order


_NO_ROWS = torch.zeros(0, dtype=torch.long)


def _fixed_rows(layout: Layout, exact_rows: int, visual_rows: torch.Tensor,
                scored: bool, reuse: bool = True,
                weighted: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The rows of a refresh besides its visual rows, on the host: the text rows after the
    head, less those skipped, and the stale labels it recomputes; and how many text rows
    were skipped. After a scoring pass they are decided without reading `visual_rows` (on
    an accelerator the device's own choice): the labels every refresh recomputes
    (`Layout.refreshed_label_rows` of no row), and the text rows skipped are those before
    the first page and before those labels, exact whatever was chosen. With label_refresh
    "page" the labels follow the choice, which is read back, and the text rows skipped are
    those before the first refreshed row; with "read" the labels are those the scoring
    pass's scores `weighted` choose, on their device (`Layout.read_label_rows`; without
    them, as the cost model asks, its guess), the text rows skipped as with "always".
    Without `reuse` (a scoring pass that stopped before the last layer: no text row's
    last-layer state) none is skipped."""
    text = layout.text_rows()
    text = text[text >= exact_rows]  # (T,)
    if not scored:
        return text, layout.refreshed_label_rows(visual_rows), 0
    if layout.label_refresh == "page":  # the labels follow the choice: it is read back
        chosen = visual_rows.to(torch.long).cpu()  # (V,)
        labels = layout.refreshed_label_rows(chosen)  # (L,)
        starts = [layout.n, *(int(r.min()) for r in (chosen, labels) if r.numel())]
    else:
        labels = layout.refreshed_label_rows(_NO_ROWS)  # (L,) whatever was chosen
        starts = [layout.n, *(s.start for s in layout.segments[:1]),
                  *(int(labels.min()) for _ in range(min(1, labels.numel())))]
        if layout.label_refresh == "read":  # the labels the question reads most
            labels = layout.read_label_rows(weighted)  # (C,) on the scores' device
    first = min(starts) if reuse else 0
    skipped = int((text < first).sum())  # the text rows before it
    return text[skipped:], labels, skipped


def refresh_rows(layout: Layout, exact_rows: int, visual_rows: torch.Tensor,
                 scored: bool, reuse: bool = True) -> tuple[torch.Tensor, int]:
    """Rows a refresh computes, ascending, on the host: text rows after the cached head plus
    `visual_rows` and the stale labels the refresh recomputes (`_fixed_rows`); after a
    scoring pass that ran every layer (`reuse`) the text rows before the first page and
    before those labels are exact already and skipped. Returns (rows, how many text rows
    were skipped after the head)."""
    text, labels, skipped = _fixed_rows(layout, exact_rows, visual_rows, scored, reuse)
    rows = torch.cat([text, labels, visual_rows.to(torch.long).cpu()]).unique(sorted=True)
    return rows, skipped


@dataclass(frozen=True)
class _PassRows:
    """The rows of one refresh on the device, and where each one's layer-1 input comes
    from (`text_from_layer_one`)."""

    rows: torch.Tensor  # (R,) ascending, on the device
    text: torch.Tensor  # (T,) the text rows among them, on the host
    text_places: torch.Tensor  # (T,) their places in `rows`, on the device
    fresh: torch.Tensor  # (F,) the visual rows and stale labels, ascending, on the device
    fresh_places: torch.Tensor  # (F,) their places in `rows`
    skipped: int  # text rows skipped after the head


def _pass_rows(layout: Layout, exact_rows: int, visual_rows: torch.Tensor, scored: bool,
               reuse: bool, device: torch.device,
               weighted: torch.Tensor | None = None) -> _PassRows:
    """`refresh_rows` without reading `visual_rows` (distinct rows, on the device): the host
    rows joined to them and sorted on the device, their count known on the host."""
    text, labels, skipped = _fixed_rows(layout, exact_rows, visual_rows, scored, reuse,
                                        weighted)
    fresh = torch.sort(torch.cat([labels.to(device),
                                  visual_rows.to(device, torch.long)])).values  # (F,)
    every = torch.cat([text.to(device), fresh])  # (R,) text rows first
    rows, order = torch.sort(every)  # (R,) ascending
    places = torch.empty_like(order).scatter_(
        0, order, torch.arange(every.numel(), device=device))  # (R,) entry i's place in rows
    n_text = int(text.numel())
    return _PassRows(rows, text, places[:n_text], fresh, places[n_text:], skipped)


@torch.no_grad()
def refresh_steps(adapter: VLMAdapter, assembly: Assembly, visual_rows: torch.Tensor,
                  resume: Resume | None = None,
                  group: int = 0) -> Generator[str, None, tuple[torch.Tensor, torch.Tensor]]:
    """Recompute `visual_rows` (distinct, in any order; a choice on the device is never read
    back) and all text rows after the head in sequence order, writing their K/V; returns
    their last-layer hidden states in row order and the rows it actually computed (R_c,),
    ascending, on the device.

    Head rows are exact from the head cache. Text row t's stale-pass result is exact when
    every key before t is as the refresh will leave it: text rows before t (by
    induction) and unselected visual rows (stale in both passes). So the text rows before
    the first page (and before the labels every refresh recomputes) are reused from the
    scoring pass, provided it ran on this cache through the last layer and nothing wrote
    since: known on the host, whatever the device chose (a pass that stopped early wrote
    no text row's K/V beyond its stop, so every text row after the head is computed); the
    other text rows start at layer 1 from the
    scoring pass's layer-0 output (exact: `conduit_core.passes.stale_pass.text_from_layer_one`),
    the visual rows and stale labels at layer 0. With `resume` (a policy already ran every token
    through the first layers), the rows start from its hidden states at layer
    `resume.layer`. With `assembly.last_only` only the last row's state is returned. It
    yields "refresh" after each group of `group` layers but the last, and with groups of
    one layer between a layer's attention and its MLP too
    (`conduit_core.passes.layer_groups`)."""
    layout = assembly.layout
    stale = assembly.stale
    device = adapter.device
    scored = stale is not None and assembly.stale_writes == assembly.cache.writes
    whole = scored and stale is not None and stale.text_hidden is not None  # every layer ran
    split = _pass_rows(layout, assembly.exact_rows, visual_rows, scored, whole, device,
                       stale.weighted if scored and stale is not None else None)
    rows, skipped, n_rows = split.rows, split.skipped, int(split.rows.numel())
    everything = n_rows == layout.n
    reused: list[torch.Tensor] = []  # last-layer states of the rows not computed
    if not assembly.last_only:
        if assembly.head is not None:
            reused.append(assembly.head.hidden)
        if whole and stale is not None and stale.text_hidden is not None:
            reused.append(stale.text_hidden[:skipped])
    if n_rows == 0:
        if assembly.last_only:
            assert stale is not None and stale.text_hidden is not None
            return stale.text_hidden[-1:], rows  # the last row is a text row
        return torch.cat(reused), rows
    assembly.text_from_one = (scored and resume is None and assembly.layer0_exact
                              and stale is not None
                              and stale.after_first is not None)
    positions = layout.position_ids.to(device)  # (P, N)
    pos = positions[:, rows].unsqueeze(1)  # (P, 1, R)
    setup = setup_rows(adapter, assembly.embeds.dtype, rows, pos, n_keys=layout.n,
                       plain_causal=everything)
    if assembly.text_from_one:
        assert stale is not None
        hidden = text_from_layer_one(adapter, assembly.cache, stale, assembly.embeds, positions,
                                     n_rows, split.text, split.text_places, split.fresh,
                                     split.fresh_places, layout.n, setup)  # (1, R, hidden)
    else:
        start = assembly.embeds if resume is None else resume.hidden  # (N, hidden)
        hidden = start[rows.to(start.device)].unsqueeze(0)  # (1, R, hidden)
    first = 1 if assembly.text_from_one else 0 if resume is None else resume.layer
    n_layers = len(adapter.layers)
    outputs = torch.tensor([n_rows - 1]) if assembly.last_only else None
    for g in layer_groups(range(first, n_layers), group):
        hidden = yield from forward_rows_steps(
            adapter, assembly.cache, hidden, rows, pos, n_keys=layout.n,
            plain_causal=everything, layers=g, setup=setup,
            outputs=outputs if g.stop == n_layers else None,
            half="refresh" if group == 1 else None)  # (1, R_c | 1, hidden)
        if g.stop < n_layers:
            yield "refresh"
    out = hidden[0]  # (R_c | 1, hidden)
    if reused:
        out = torch.cat([*(r.to(out.dtype) for r in reused), out])  # (R, hidden)
    return out, rows
