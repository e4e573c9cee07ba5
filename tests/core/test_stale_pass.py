"""The scoring pass: question-row attention probabilities over all keys and value norms.

In the context a page was prefilled in, the stale cache is exact, so the probabilities must
equal the model's own eager attention weights of those rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core import PageInput, ReuseRuntime
from tests.core.conftest import FAMILIES, load_builtin
from tests.core.helpers import IMAGES


@pytest.mark.parametrize("name", FAMILIES)
def test_stale_pass_probabilities_match_eager_attention(name: str, model_cache: Path) -> None:
    vlm = load_builtin(name, model_cache, attn="eager")
    rt = ReuseRuntime(vlm)
    (page,) = rt.prefill_pages([IMAGES["a"]])
    asm = rt.assemble("", [PageInput("", page)], "What is the total amount due?")
    scores, flops = rt.scoring(asm)
    layout = asm.layout
    n_layers, heads = len(vlm.adapter.layers), vlm.adapter.text_config.num_attention_heads
    q_rows = layout.question_rows()
    assert scores.probs.shape == (n_layers, heads, q_rows.numel(), layout.n)
    assert scores.value_norms.shape == (n_layers, vlm.adapter.text_config.num_key_value_heads,
                                        layout.n)
    assert flops > 0
    prepared = vlm.adapter.prepare_pages([IMAGES["a"]])
    kwargs = vlm.adapter.reference_inputs(layout.token_ids, prepared)
    with torch.no_grad():
        out = vlm.model(**kwargs, output_attentions=True)
    for layer, att in enumerate(out.attentions):
        ref = att[0][:, q_rows]  # (H, n_q, N)
        assert (scores.probs[layer] - ref).abs().max().item() <= 1e-5
    torch.testing.assert_close(scores.probs.sum(-1), torch.ones(n_layers, heads, q_rows.numel()))
    later = torch.arange(layout.n).view(1, -1) > q_rows.view(-1, 1)  # keys after the row
    assert scores.probs[:, :, later].abs().max().item() == 0.0
    # value norms are the norms of the cache values (text rows now fresh)
    torch.testing.assert_close(scores.value_norms, asm.cache.values[:, 0].norm(dim=-1))
