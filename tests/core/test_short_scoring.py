"""A scoring pass that stops after its last scored layer (issues 65 and 67).

Scored layers that end before the model's last layer (a range, or a depth f: the first
ceil(f * L) layers) run the pass through those layers only: it writes no text row's K/V
beyond them, issues fewer operations and is charged fewer FLOPs, and the refresh then
computes every text row after the head itself (none is taken as done), so the answer equals
the one after recomputing every text row; a pass through every layer is unchanged.
"""

from __future__ import annotations

import math

import pytest
import torch

from conduit_core import PageInput, ReuseRuntime
from conduit_core.answer_types import AnswerRequest
from conduit_core.errors import InvalidRequestError
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies import choose_policy
from conduit_core.policies.choice import PolicyOptions
from lab import answering
from lab.diagnostics import kv_error
from lab.ttft.op_count import count_ops
from tests.core.helpers import IMAGES, own_flops
from tests.device import atol, tol

PREFIX = "You answer questions about the invoice and the contract."
LABELS = ["Page 3:\n", "Page 7 shows the table:\n"]
QUESTION = "What is the total amount?"


def _assemble(runtime: ReuseRuntime) -> Assembly:
    kvs = runtime.prefill_pages([IMAGES["a"], IMAGES["b"]])
    return runtime.reuse.assemble(PREFIX, [PageInput(lab, kv) for lab, kv in
                                           zip(LABELS, kvs, strict=True)], QUESTION)


def test_a_depth_is_the_first_layers_of_any_model() -> None:
    for depth, n_layers, stop in [(0.6, 5, 3), (0.8, 5, 4), (1.0, 5, 5), (0.7, 10, 7),
                                  (0.6, 28, 17), (0.01, 28, 1), (0.5, 1, 1)]:
        assert ScoreConfig(layers=depth).layer_slice(n_layers) == slice(0, stop), depth
    for bad in (0.0, -0.5, 1.5, math.nan):
        with pytest.raises(ValueError, match="depth"):
            ScoreConfig(layers=bad)
    choice = choose_policy("conduit_per_page", PolicyOptions(score_layers=0.6))
    assert choice.options.score_layers == 0.6
    with pytest.raises(InvalidRequestError, match="depth"):
        choose_policy("conduit_per_page", PolicyOptions(score_layers=1.5))


def test_the_pass_stops_after_its_last_scored_layer(runtime: ReuseRuntime) -> None:
    """Layers after the last scored one are not run: their K/V of the text rows stay as
    assembled, the pass issues fewer operations and is charged less; scores equal those of
    the same layers scored by a pass through every layer."""
    n_layers = len(runtime.adapter.layers)
    short, depth = ScoreConfig(layers=0.5), n_layers // 2 + n_layers % 2
    full, part = _assemble(runtime), _assemble(runtime)
    text = part.fresh_text_rows().to(part.cache.keys.device)
    part.cache.keys[:, :, :, text] = 7.0  # a finite mark: a lent cache may hold NaN there
    before = part.cache.keys[:, :, :, text].clone()  # (L, B, G, T, hd)
    (scores_full, charged_full), ops_full = count_ops(lambda: runtime.reuse.scoring(full))
    (scores, charged), ops = count_ops(lambda: runtime.reuse.scoring(part, short))
    after = part.cache.keys[:, :, :, text]
    assert not torch.equal(after[:depth], before[:depth])  # written where it ran
    assert torch.equal(after[depth:], before[depth:])  # not beyond its stop
    assert scores.text_hidden is None and scores.after_first is not None
    assert scores_full.text_hidden is not None
    assert charged < charged_full * (depth + 1) / n_layers
    assert ops.total < ops_full.total * (depth + 1) / n_layers
    same = _assemble(runtime)
    with_all = runtime.reuse.scoring(same, ScoreConfig(layers=(0, depth)))[0]
    torch.testing.assert_close(scores.weighted, with_all.weighted, **tol("scores"))


@pytest.mark.parametrize("labels", ["text", "page"])
def test_the_refresh_after_a_short_pass_recomputes_its_text_rows(
        runtime: ReuseRuntime, labels: str) -> None:
    """The text rows before the first page (the labels as text rows, or no label
    refreshed) are skipped after a pass through every layer; after a short pass they are
    computed, and hidden states and K/V equal a refresh that recomputes every text row."""
    runtime = (ReuseRuntime(runtime.vlm, label_cache=False) if labels == "text"
               else ReuseRuntime(runtime.vlm, label_refresh="page"))
    fast, slow, whole = _assemble(runtime), _assemble(runtime), _assemble(runtime)
    short = ScoreConfig(layers=(0, 1))
    for asm in (fast, slow):
        runtime.reuse.scoring(asm, short)
    runtime.reuse.scoring(whole)
    slow.stale = None  # the reference: every text row recomputed from layer 0
    first, second = fast.layout.segments
    for visual in (torch.tensor([first.stop - 1, second.start + 1, second.stop - 2]),
                   torch.zeros(0, dtype=torch.long)):
        hidden, computed = runtime.reuse.refresh(fast, visual)
        ref_hidden, ref_computed = runtime.reuse.refresh(slow, visual)
        assert torch.equal(computed.cpu(), ref_computed.cpu())
        assert fast.text_from_one and not slow.text_from_one
        torch.testing.assert_close(hidden, ref_hidden, **tol("hidden"))
        err = kv_error(fast.cache, slow.cache, torch.arange(fast.layout.n))
        assert err.key_max_abs.max().item() <= atol("hidden")
        assert err.value_max_abs.max().item() <= atol("hidden")
        _, skipping = runtime.reuse.refresh(whole, visual)
        if labels == "text" or not visual.numel():  # a whole pass skips some of them
            assert skipping.numel() < computed.numel()
        for asm in (fast, slow, whole):  # the refresh wrote: score again for the next
            runtime.reuse.scoring(asm, ScoreConfig() if asm is whole else short)
        slow.stale = None


def test_an_answer_after_a_short_pass_is_charged_as_predicted(runtime: ReuseRuntime) -> None:
    """Cold and warm, the same tokens and charge; the prediction of the short pass and its
    refresh (every text row, the labels among them) within the estimate's 5% of the charge
    cold, and within 0.1% warm (its rows placed where the same request's fell), below a
    whole pass's."""
    runtime = ReuseRuntime(runtime.vlm, label_cache=False, never_above_full=False)
    kvs = runtime.prefill_pages([IMAGES["a"], IMAGES["b"]])
    pages = [PageInput(lab, kv) for lab, kv in zip(LABELS, kvs, strict=True)]
    charged = {}
    for depth in (0.5, 1.0):
        request = AnswerRequest(
            PREFIX, pages, QUESTION, budget=0.2, max_new_tokens=3,
            policy=choose_policy("conduit_per_page", PolicyOptions(score_layers=depth)))
        cold, warm = answering.answer(runtime, request), answering.answer(runtime, request)
        assert cold.token_ids == warm.token_ids and not cold.fallback
        own = own_flops(warm)
        assert own == pytest.approx(own_flops(cold), rel=1e-12)
        assert cold.predicted_flops_lm == pytest.approx(own, rel=0.05)
        assert warm.predicted_flops_lm == pytest.approx(own, rel=1e-3)
        charged[depth] = own
    assert charged[0.5] < charged[1.0]
