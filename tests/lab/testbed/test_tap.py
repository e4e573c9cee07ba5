"""The attention tap: log-probabilities of supervised (row, query, key) triples from the kept
queries and keys equal the eager kernel's attention probabilities."""

import random

import torch

from conduit_core.model.adapters.qwen2_vl import Qwen2VLAdapter
from conduit_core.model.testbed_model import MAX_IMAGE_TOKENS, build_testbed
from lab.testbed.batches import GlyphPatches, Layouts, batch_hidden, draw_sample, make_batch
from lab.testbed.tap import Tap
from lab.testbed.task import Shape

SMALL = Shape(cols=16, rows=8, pages=(6, 6), shown=(4, 4))
LAYERS = {1, 3}
SHARPEN = 5.0  # queries and keys scaled: a random init attends almost uniformly, which any
#                head or layer would match; scaled, log-probabilities spread over several nats


def _eager_attentions(model, batch):
    """Every layer's attention probabilities (B, heads, N, N) from the eager kernel, on the
    inputs `batch_hidden` feeds the language model."""
    inner = model.model
    embeds = inner.language_model.embed_tokens(batch.ids)  # (B, N, hidden)
    feats = inner.get_image_features(batch.pixel_values, batch.grids,
                                     return_dict=True).pooler_output
    feats = torch.cat(list(feats)) if isinstance(feats, list | tuple) else feats
    mask = batch.ids == inner.config.image_token_id  # (B, N)
    embeds = embeds.masked_scatter(mask.unsqueeze(-1), feats.to(embeds.dtype))
    model.set_attn_implementation("eager")
    out = inner.language_model(inputs_embeds=embeds, position_ids=batch.position_ids,
                               use_cache=False, output_attentions=True)
    return out.attentions


@torch.no_grad()
def test_tapped_log_probs_equal_the_eager_attention():
    torch.manual_seed(0)
    model, processor = build_testbed(weights=None)
    for layer in model.model.language_model.layers:
        layer.self_attn.q_proj.weight.mul_(SHARPEN)
        layer.self_attn.k_proj.weight.mul_(SHARPEN)
    adapter = Qwen2VLAdapter(model, processor, processor.tokenizer, MAX_IMAGE_TOKENS)
    rng = random.Random(0)
    batch = make_batch([draw_sample(rng, SMALL, follow_ups=1) for _ in range(2)],
                       Layouts(adapter, SMALL), GlyphPatches(processor))
    tap = Tap(LAYERS)
    tap.install(model)
    batch_hidden(model, batch)
    assert set(tap.kept) == LAYERS
    n = batch.ids.shape[1]
    extra = [(b, i, j) for b in (0, 1) for i, j in ((5, 0), (n - 1, n - 1), (n - 1, 3),
                                                      (n // 2, n // 3))]
    targets = torch.cat([batch.look_q, batch.look_p, torch.tensor(extra)])  # (T, 3)
    targets = targets[targets[:, 0].argsort(stable=True)]  # log_probs answers row by row
    attn = _eager_attentions(model, batch)
    for layer in LAYERS:
        for head in (0, 1):
            got = tap.log_probs(layer, targets, head)  # (T,)
            b, i, j = targets.unbind(1)
            want = attn[layer][b, head, i, j].log()  # (T,)
            assert torch.allclose(got, want, atol=1e-5, rtol=0), (layer, head)
            uniform = -(i + 1).double().log()  # (T,) what a flat causal row would give
            assert (want.double() - uniform).abs().max() > 1.0  # the parity is not trivial
    later = torch.tensor([(0, 4, 5), (0, 4, n - 1), (1, 10, 11)])  # keys after the query
    assert torch.isneginf(tap.log_probs(1, later)).all()
