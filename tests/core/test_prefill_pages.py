"""Page prefill: batched pages equal pages prefilled one by one, and PageKV carries what the
design stores (layer-0 embeddings, per-layer K/V, positions, token ids, grid, fingerprint)."""

from __future__ import annotations

import torch

from conduit_core import ReuseRuntime
from conduit_core.prompt.layout import page_context
from tests.core.helpers import IMAGES, reference_hidden_states
from tests.device import atol


def test_batched_prefill_equals_single_page_prefill(runtime: ReuseRuntime) -> None:
    imgs = [IMAGES["a"], IMAGES["b"], IMAGES["c"]]
    batched = runtime.prefill_pages(imgs)  # different sizes: right-padded batch
    runtime.page_batch_size = 1
    try:
        single = runtime.prefill_pages(imgs)
    finally:
        runtime.page_batch_size = 8
    assert len({p.num_tokens for p in batched}) > 1
    for x, y in zip(batched, single, strict=True):
        assert torch.equal(x.token_ids, y.token_ids) and torch.equal(x.position_ids,
                                                                     y.position_ids)
        assert (x.keys - y.keys).abs().max().item() <= atol("keys")
        assert (x.values - y.values).abs().max().item() <= atol("keys")
        assert (x.embeds - y.embeds).abs().max().item() <= atol("keys")


def test_page_kv_contents(runtime: ReuseRuntime) -> None:
    (page,) = runtime.prefill_pages([IMAGES["b"]])
    cfg = runtime.adapter.text_config
    n_layers, t = len(runtime.adapter.layers), page.num_tokens
    head_dim = runtime.adapter.layers[0].self_attn.head_dim
    assert page.keys.shape == page.values.shape == (n_layers, cfg.num_key_value_heads, t,
                                                    head_dim)
    assert page.embeds.shape == (t, cfg.hidden_size)
    assert page.position_ids.shape == (runtime.adapter.rope_axes, t)
    assert page.fingerprint == runtime.vlm.fingerprint and page.nbytes > 0
    # the stored embeddings are the model's own layer-0 inputs of the segment
    ctx = page_context(runtime.adapter, page.token_ids, page.image_grid)
    seg = ctx.segments[0]
    layer0 = reference_hidden_states(runtime.vlm, ctx.token_ids, [IMAGES["b"]])[0]
    stored = page.embeds.to(layer0.device)  # pages are kept on the host
    assert (stored - layer0[seg.start:seg.stop]).abs().max().item() <= atol("keys")
