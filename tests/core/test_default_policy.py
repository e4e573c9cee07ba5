"""The product default (issues 65 and 67): the default policy (`DEFAULT_POLICY`) is
`conduit_per_page` at depth 0.8 (`conduit_focus`, with its measured constants: a floor of 0.3
of k, half the score mass, 64 boundary rows, is a named policy, not the default: it missed the
bar on seed 0, docs/DECISIONS.md), and a runtime with its default options running it scores
with the first ceil(0.8 L) of the model's L decoder layers, its scoring pass stopping there,
and its refresh recomputes only the stale labels the question reads most (`label_refresh`
"read"), not every stale label.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from conduit_core import PageInput, ReuseRuntime
from conduit_core.policies import choose_policy
from conduit_core.policies.choice import DEFAULT_POLICY
from conduit_core.policies.conduit import ConduitPolicy
from conduit_core.policies.conduit_focus import FocusPolicy
from conduit_core.policies.conduit_per_page import DEPTH
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES

PREFIX = "You answer questions about the document pages shown. Cite pages by their labels."
QUESTION = "What is the total amount due, and who signed?"
LABELS = ["[report.pdf p.1]", "[report.pdf p.2]", "[annex.pdf p.7]", "[memo.pdf p.12]"]


def test_the_default_is_conduit_per_page_and_focus_is_named() -> None:
    choice = choose_policy(DEFAULT_POLICY)
    assert choice.name == DEFAULT_POLICY == "conduit_per_page"
    default = choice.select
    assert isinstance(default, ConduitPolicy) and not isinstance(default, FocusPolicy)
    assert default.config.per_page and default.config.gamma == 0.0
    assert default.config.score.layers == DEPTH == 0.8
    focus = choose_policy("conduit_focus").select
    assert isinstance(focus, FocusPolicy)
    assert (focus.floor, focus.mass, focus.boundary) == (0.3, 0.5, 64)
    assert focus.config.score.layers == DEPTH and focus.config.gamma == 0.0
    assert focus.fixed == default.fixed == frozenset({"gamma"})


def test_the_default_scores_the_first_layers_and_refreshes_the_labels_read(
        model_cache: Path) -> None:
    # the embedded default's 8 layers tell a short pass from a whole one (ceil(0.8 * 4) = 4)
    runtime = ReuseRuntime(load_builtin("builtin:small-qwen2-vl", model_cache))
    kvs = runtime.prefill_pages([IMAGES[k] for k in "abca"])
    pages = [PageInput(label, kv) for label, kv in zip(LABELS, kvs, strict=True)]
    asm = runtime.reuse.assemble(PREFIX, pages, QUESTION, last_only=True)
    n_layers = len(runtime.adapter.layers)
    stop = math.ceil(0.8 * n_layers)
    assert stop < n_layers
    text = asm.fresh_text_rows().to(asm.cache.keys.device)
    asm.cache.keys[:, :, :, text] = 7.0  # a finite mark where the scoring pass writes
    ctx = runtime.reuse.policy_context(asm, 0.1, 0)
    visual = choose_policy(DEFAULT_POLICY).select(ctx)
    # random weights, diffuse attention: `conduit_focus`'s cap binds, the default's choice
    assert torch.equal(visual, choose_policy("conduit_focus").select(ctx))
    after = asm.cache.keys[:, :, :, text]  # (L, B, G, T, hd)
    assert not torch.equal(after[:stop], torch.full_like(after[:stop], 7.0))
    assert torch.equal(after[stop:], torch.full_like(after[stop:], 7.0))  # stopped there

    _, computed = runtime.reuse.refresh(asm, visual, ctx.resume)
    assert asm.stale is not None
    layout = asm.layout
    stale = torch.cat([torch.arange(s.start, s.stop) for s in layout.labels
                       if s.start != layout.head])  # every stale label's rows
    labels_done = computed.cpu()[torch.isin(computed.cpu(), stale)]
    read = layout.read_label_rows(asm.stale.weighted).cpu()
    assert 0 < read.numel() < stale.numel()
    assert torch.equal(labels_done, read)
