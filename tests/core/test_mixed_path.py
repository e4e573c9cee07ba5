"""The masked, mixed stale/fresh path against an independent reference, for every family.

Budget 1.0 takes the plain causal path, and CONDUIT skips scoring at k = N_v, so neither
checks the path real requests take: some visual rows fresh, the others stale, every text row
recomputed under the exact causal mask (blocked, and through the one-mask reference path).
Here pages are cut out of one full prefill and reused in that same layout, where stale K/V
are exact: refreshing any subset of their rows must give the transformers model's own logits.
Under a new prefix the reused pages are stale, and refreshing more of them must bring the
logits closer to a full prefill."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core import PageInput, ReuseRuntime
from conduit_core.passes import layer_forward
from tests.core.conftest import FAMILIES, load_builtin
from tests.core.helpers import IMAGES, full_logits, page_from_assembly, reference_logits
from tests.device import atol

PREFIX = "You answer questions about the annual report."
LABELS = ["Page 1:\n", "Page 2 shows the table:\n"]
QUESTION = "Which region had the highest sales in March?"
FRACTIONS = (0.0, 0.3, 0.7)



def _subset(visual: torch.Tensor, fraction: float, seed: int) -> torch.Tensor:
    """round(fraction * N_v) visual rows drawn at random ("any rows")."""
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(visual.numel(), generator=gen)[:round(fraction * visual.numel())]
    return visual[pick.sort().values]


@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("name", FAMILIES)
def test_reuse_in_the_same_layout_gives_the_models_logits(name: str, blocked: bool,
                                                          model_cache: Path) -> None:
    vlm = load_builtin(name, model_cache)
    rt = ReuseRuntime(vlm, label_cache=False)  # every cached row cut from this layout
    images = [IMAGES["a"], IMAGES["b"]]
    fresh, _ = full_logits(rt, PREFIX, list(zip(LABELS, images, strict=True)), QUESTION)
    ref = reference_logits(vlm, fresh, images)  # (N, vocab): the model's own forward
    cut = [page_from_assembly(rt, fresh, i) for i in range(len(images))]
    inputs = [PageInput(label, kv) for label, kv in zip(LABELS, cut, strict=True)]
    for fraction in FRACTIONS:
        for scored in (False, True):  # with a scoring pass, the prefix rows come from it
            asm = rt.reuse.assemble(PREFIX, inputs, QUESTION)
            assert torch.equal(asm.layout.token_ids, fresh.layout.token_ids)
            visual = _subset(asm.layout.visual_rows(), fraction, seed=int(fraction * 10))
            with layer_forward.blocked_rows(blocked):
                if scored:
                    rt.reuse.scoring(asm)
                hidden, computed = rt.reuse.refresh(asm, visual)
            rows = torch.cat([asm.layout.text_rows(), visual]).unique()  # (R,)
            if scored and fraction:
                assert computed.numel() < rows.numel()  # the prefix rows were reused
            got = rt.reuse.logits(hidden)  # (R, vocab)
            err = float((got - ref[rows]).abs().max())
            assert err <= atol("logits"), (fraction, scored, err)


@pytest.mark.parametrize("name", FAMILIES)
def test_stale_pages_approach_full_prefill_as_the_budget_grows(name: str,
                                                               model_cache: Path) -> None:
    rt = ReuseRuntime(load_builtin(name, model_cache))
    images = [IMAGES["a"], IMAGES["b"]]
    _, ref = full_logits(rt, PREFIX, list(zip(LABELS, images, strict=True)), QUESTION)
    inputs = [PageInput(label, kv) for label, kv in zip(LABELS, rt.prefill_pages(images),
                                                        strict=True)]
    errors = []
    for fraction in (*FRACTIONS, 1.0):
        asm = rt.reuse.assemble(PREFIX, inputs, QUESTION)
        visual = asm.layout.visual_rows()
        # nested subsets: the first rows of one random order, so more budget adds rows
        order = torch.randperm(visual.numel(), generator=torch.Generator().manual_seed(0))
        chosen = visual[order[:round(fraction * visual.numel())].sort().values]
        hidden, _ = rt.reuse.refresh(asm, chosen)
        rows = torch.cat([asm.layout.text_rows(), chosen]).unique()
        errors.append(float((rt.reuse.logits(hidden)[-1] - ref[rows[-1]]).abs().max()))
    assert errors[0] > 1e-4  # a new prefix makes the pages measurably stale
    assert errors[-1] <= atol("logits")  # everything refreshed: the full prefill
    assert errors[0] > errors[1] > errors[2] > errors[3], errors
