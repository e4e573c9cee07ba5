"""The scoring pass: question-row attention probabilities over all keys, reduced layer by
layer into per-token scores.

In the context a page was prefilled in, the stale cache is exact, so the probabilities must
equal the model's own eager attention weights of those rows, and the scores must equal the
norm-weighted attention computed from the model's own attentions and its own value cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core import PageInput, ReuseRuntime
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.layer_forward import forward_rows
from conduit_core.passes.layer_groups import drain
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.passes.stale_pass import StaleScores, fused_layers, stale_steps
from tests.core.conftest import FAMILIES, load_builtin
from tests.core.helpers import IMAGES, token_scores
from tests.device import atol, tol

QUESTION = "What is the total amount due?"


def _scoring(rt: ReuseRuntime, asm: Assembly, config: ScoreConfig,
             keep_probs: bool = False, chunk: int | None = None,
             monkeypatch: pytest.MonkeyPatch | None = None) -> StaleScores:
    layout = asm.layout
    if chunk is not None and monkeypatch is not None:
        heads = rt.adapter.text_config.num_attention_heads
        monkeypatch.setattr("conduit_core.passes.stale_pass.SCORE_CHUNK_ELEMENTS",
                            chunk * heads * layout.n)
    return drain(stale_steps(rt.adapter, asm.cache, asm.embeds, layout.position_ids,
                             layout.text_rows(), layout.question_rows(), layout.n, config,
                             keep_probs=keep_probs, n_prompt=layout.prompt))


@pytest.mark.parametrize("name", FAMILIES)
def test_scores_match_the_models_own_attention_and_values(name: str,
                                                          model_cache: Path) -> None:
    vlm = load_builtin(name, model_cache, attn="eager")
    rt = ReuseRuntime(vlm)
    (page,) = rt.prefill_pages([IMAGES["a"]])
    asm = rt.reuse.assemble("", [PageInput("", page)], QUESTION)
    scores, flops = rt.reuse.scoring(asm)
    layout = asm.layout
    n_layers, heads = len(vlm.adapter.layers), vlm.adapter.text_config.num_attention_heads
    q_rows = layout.question_rows()
    assert scores.weighted.shape == scores.attention.shape == (layout.n,)
    assert scores.probs is None and flops > 0
    prepared = vlm.adapter.prepare_pages([IMAGES["a"]])
    kwargs = vlm.adapter.reference_inputs(layout.token_ids, prepared)
    with torch.no_grad():
        out = vlm.model(**kwargs, output_attentions=True, use_cache=True)
    ref_probs = torch.stack([att[0][:, q_rows] for att in out.attentions])  # (L, H, Q, N)
    cache = out.past_key_values
    ref_norms = torch.stack([cache.layers[i].values[0].norm(dim=-1)
                             for i in range(n_layers)])  # (L, G, N) the model's own values
    # s_j = mean over layers and question rows of the head-mean of A * ||V||, by hand
    rep = heads // ref_norms.shape[1]
    by_hand = (ref_probs * ref_norms.repeat_interleave(rep, dim=1).unsqueeze(2)).mean(
        dim=(0, 1, 2))  # (N,)
    torch.testing.assert_close(scores.weighted, by_hand.float(), **tol("scores"))
    torch.testing.assert_close(scores.attention, ref_probs.mean(dim=(0, 1, 2)).float(),
                               **tol("scores"))
    kept = _scoring(rt, rt.reuse.assemble("", [PageInput("", page)], QUESTION), ScoreConfig(),
                    keep_probs=True)
    assert kept.probs is not None and kept.probs.shape == ref_probs.shape
    assert (kept.probs - ref_probs).abs().max().item() <= atol("keys")
    later = torch.arange(layout.n).view(1, -1) > q_rows.view(-1, 1)  # keys after the row
    assert kept.probs[:, :, later].abs().max().item() == 0.0


CONFIGS = [ScoreConfig(), ScoreConfig(layers=(1, 2)), ScoreConfig(layers=(-1, None)),  # type: ignore[arg-type]
           ScoreConfig(query_window=3), ScoreConfig(head_agg="max"),
           ScoreConfig(layers=(0, 1), query_window=1, head_agg="max"),
           ScoreConfig(value_norm="layer"), ScoreConfig(query_rows="question"),
           ScoreConfig(query_rows="question", query_window=2, value_norm="layer")]


def test_layer_by_layer_reduction_equals_the_all_layers_reference(
        model_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every knob, and question rows taken in chunks of 2, give exactly the reduction of the
    full (L, H, Q, N) probabilities that the pass no longer keeps."""
    rt = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache))
    pages = rt.prefill_pages([IMAGES["a"], IMAGES["b"]])
    inputs = [PageInput("Page 1:", pages[0]), PageInput("Page 2:", pages[1])]
    asm = rt.reuse.assemble("New prefix.", inputs, QUESTION)
    full = _scoring(rt, asm, ScoreConfig(), keep_probs=True)
    probs = full.probs  # (L, H, Q, N)
    assert probs is not None
    norms = asm.cache.values[:, 0, :, :asm.layout.n].float().norm(dim=-1)  # (L, G, N)
    n_prompt = asm.layout.prompt
    assert n_prompt == len(rt.adapter.tail_ids("")) > 0  # the generation prompt's rows
    default = token_scores(probs, norms, ScoreConfig(), n_prompt=n_prompt)
    for config in CONFIGS:
        for chunk in (None, 2):
            got = _scoring(rt, rt.reuse.assemble("New prefix.", inputs, QUESTION), config,
                           chunk=chunk, monkeypatch=monkeypatch)
            want = token_scores(probs, norms, config, n_prompt=n_prompt)
            torch.testing.assert_close(got.weighted, want, atol=1e-7, rtol=1e-5)
            torch.testing.assert_close(got.attention,
                                       token_scores(probs, norms, config, value_norm=False,
                                                    n_prompt=n_prompt),
                                       atol=1e-7, rtol=1e-5)
            if config != ScoreConfig():  # each knob has its own effect
                assert not torch.allclose(want, default, atol=1e-7, rtol=1e-4), config
        monkeypatch.undo()


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("last_only", [False, True])
def test_the_scoring_probabilities_give_the_layers_attention(
        name: str, last_only: bool, model_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the scored rows are every text row (the default), the pass takes each scored
    layer's attention output from its own probabilities (`fused_layers`); its hidden states
    and K/V equal a plain forward of the same rows over the same cache, question rows taken
    whole and in chunks of 2, and it is charged less than the unfused pass."""
    rt = ReuseRuntime(load_builtin(name, model_cache))
    pages = rt.prefill_pages([IMAGES["a"], IMAGES["b"]])
    inputs = [PageInput("Page 1:", pages[0]), PageInput("Page 2:", pages[1])]
    n_layers = len(rt.adapter.layers)
    for chunk in (None, 2):
        if chunk is not None:
            heads = rt.adapter.text_config.num_attention_heads
            monkeypatch.setattr("conduit_core.passes.stale_pass.SCORE_CHUNK_ELEMENTS",
                                chunk * heads * 4096)
        asm = rt.reuse.assemble("New prefix.", inputs, QUESTION, last_only=last_only)
        ref = rt.reuse.assemble("New prefix.", inputs, QUESTION, last_only=last_only)
        text, layout = asm.fresh_text_rows(), asm.layout
        assert torch.equal(text, layout.question_rows())  # every text row is scored
        fused = fused_layers(range(n_layers), text.numel(), text.numel(), last_only,
                             rt.adapter.device)
        assert fused == list(range(n_layers - 1 if last_only else n_layers))
        scores, charged = rt.reuse.scoring(asm)
        pos = layout.position_ids[:, text].unsqueeze(1)  # (P, 1, N_t)
        hidden = ref.embeds[text].unsqueeze(0)  # (1, N_t, hidden)
        with torch.no_grad():
            first = forward_rows(rt.adapter, ref.cache, hidden, text, pos, n_keys=layout.n,
                                 layers=range(1))  # (1, N_t, hidden)
            outputs = torch.tensor([text.numel() - 1]) if last_only else None
            last = forward_rows(rt.adapter, ref.cache, first, text, pos, n_keys=layout.n,
                                layers=range(1, n_layers), outputs=outputs)
        assert scores.after_first is not None and scores.text_hidden is not None
        torch.testing.assert_close(scores.after_first, first[0], **tol("logits"))
        torch.testing.assert_close(scores.text_hidden, last[0], **tol("logits"))
        torch.testing.assert_close(asm.cache.keys[:, :, :, text], ref.cache.keys[:, :, :, text],
                                   **tol("keys"))
        unfused = (rt.reuse.costs.refresh(layout, text, last_only)
                   + rt.reuse.flops.scoring(text.numel(), layout.n, n_layers))
        assert charged < unfused
        monkeypatch.undo()


@pytest.mark.parametrize("name", FAMILIES)
def test_an_accelerators_passes_equal_the_cpus(name: str, model_cache: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On an accelerator's path (one masked sdpa call a layer; the scored layers' attention
    output from their own sdpa call, not from the probabilities: `FUSED_SCORES`; the masks of
    the refresh's layer-0 rows and of the last row taken from every row's) the scoring pass
    and the refresh after it give the CPU's scores, hidden states, K/V and first-token
    logits, over the same rows; only there is the scoring pass charged its unfused
    attention (QK^T of its rows twice)."""
    rt = ReuseRuntime(load_builtin(name, model_cache))
    pages = rt.prefill_pages([IMAGES["a"], IMAGES["b"]])
    inputs = [PageInput("Page 1:", pages[0]), PageInput("Page 2:", pages[1])]
    chosen: torch.Tensor | None = None
    runs: list[tuple[StaleScores, float, torch.Tensor, torch.Tensor, torch.Tensor,
                     torch.Tensor]] = []
    for accelerator in (False, True):
        if accelerator:
            monkeypatch.setattr("conduit_core.passes.stale_pass.FUSED_SCORES", set())
            monkeypatch.setattr("conduit_core.passes.row_attention.ROW_GROUPS", {})
        asm = rt.reuse.assemble("New prefix.", inputs, QUESTION, last_only=True)
        scores, charged = rt.reuse.scoring(asm)
        text, n_layers = asm.fresh_text_rows(), len(rt.adapter.layers)
        unfused = (rt.reuse.costs.refresh(asm.layout, text, True)
                   + rt.reuse.flops.scoring(text.numel(), asm.layout.n, n_layers))
        assert (charged == pytest.approx(unfused)) == accelerator
        if chosen is None:  # the CPU's choice, refreshed on both paths
            visual = asm.layout.visual_rows()
            chosen = visual[scores.weighted[visual].topk(max(1, visual.numel() // 5)).indices]
        hidden, rows = rt.reuse.refresh(asm, chosen)
        n = asm.layout.n
        runs.append((scores, charged, rt.reuse.logits(hidden[-1:])[-1], rows.cpu(),
                     asm.cache.keys[:, :, :, :n], asm.cache.values[:, :, :, :n]))
        monkeypatch.undo()
    cpu, acc = runs
    for field in ("weighted", "attention"):
        torch.testing.assert_close(getattr(acc[0], field), getattr(cpu[0], field),
                                   **tol("scores"))
    for field in ("after_first", "text_hidden"):
        torch.testing.assert_close(getattr(acc[0], field), getattr(cpu[0], field),
                                   **tol("hidden"))
    torch.testing.assert_close(acc[2], cpu[2], **tol("logits"))
    assert torch.equal(acc[3], cpu[3])
    torch.testing.assert_close(acc[4], cpu[4], **tol("keys"))
    torch.testing.assert_close(acc[5], cpu[5], **tol("keys"))
