"""The refresh reuses the scoring pass's text rows before the first refreshed visual token,
and starts the later text rows at layer 1 from the scoring pass's layer-0 output: the result
equals recomputing them, and the reuse is dropped once the cache was written."""

from __future__ import annotations

import torch

from conduit_core import PageInput, ReuseRuntime
from conduit_core.passes.assembly import Assembly
from lab import answering
from lab.diagnostics import kv_error
from storage.kv.codec import quantize_roundtrip
from tests.core.helpers import IMAGES
from tests.device import atol, tol

PREFIX = "You answer questions about the invoice and the contract."
LABELS = ["Page 3:\n", "Page 7 shows the table:\n"]
QUESTION = "What is the total amount?"


def _assemble(runtime: ReuseRuntime, int8: bool = False) -> Assembly:
    kvs = runtime.prefill_pages([IMAGES["a"], IMAGES["b"]])
    kvs = [quantize_roundtrip(kv) for kv in kvs] if int8 else kvs
    return runtime.reuse.assemble(PREFIX, [PageInput(lab, kv) for lab, kv in
                                     zip(LABELS, kvs, strict=True)], QUESTION)


def _visual_choice(asm: Assembly) -> torch.Tensor:
    """Some tokens of the second page and the last of the first (not its first ones)."""
    first, second = asm.layout.segments
    return torch.tensor([first.stop - 1, second.start + 1, second.start + 4, second.stop - 2])


def test_reused_text_rows_equal_recomputed_ones(runtime: ReuseRuntime) -> None:
    runtime = ReuseRuntime(runtime.vlm, label_cache=False)  # the labels are text rows
    fast, slow = _assemble(runtime), _assemble(runtime)
    runtime.reuse.scoring(fast)
    runtime.reuse.scoring(slow)
    slow.stale = None  # the reference: every text row recomputed
    visual = _visual_choice(fast)
    hidden, computed = runtime.reuse.refresh(fast, visual)
    ref_hidden, ref_computed = runtime.reuse.refresh(slow, visual)
    text = fast.fresh_text_rows()  # the head's rows come from the head cache
    assert text.numel() < fast.layout.text_rows().numel()
    reused = text[text < int(visual.min())]
    assert reused.numel() >= 3  # the first label
    assert torch.equal(ref_computed, torch.cat([text, visual]).unique())
    assert torch.equal(computed, ref_computed[reused.numel():])
    assert fast.text_from_one and not slow.text_from_one  # layer 0 of its text rows reused
    torch.testing.assert_close(hidden, ref_hidden, **tol("hidden"))
    err = kv_error(fast.cache, slow.cache, torch.arange(fast.layout.n))
    assert err.key_max_abs.max().item() <= atol("hidden")
    assert err.value_max_abs.max().item() <= atol("hidden")


def test_no_refreshed_visual_token_reuses_every_text_row(runtime: ReuseRuntime) -> None:
    runtime = ReuseRuntime(runtime.vlm, label_refresh="page")  # no label refreshed either
    fast, slow = _assemble(runtime), _assemble(runtime)
    runtime.reuse.scoring(fast)
    none = torch.zeros(0, dtype=torch.long)
    hidden, computed = runtime.reuse.refresh(fast, none)
    assert computed.numel() == 0
    torch.testing.assert_close(hidden, answering.prefill(runtime, slow, none), **tol("hidden"))


def test_a_cache_write_after_scoring_drops_the_reuse(runtime: ReuseRuntime) -> None:
    runtime = ReuseRuntime(runtime.vlm, label_refresh="page")  # the text rows alone
    asm = _assemble(runtime)
    runtime.reuse.scoring(asm)
    k = asm.cache.keys[0, :, :, :1].clone()  # (B, G, 1, hd)
    asm.cache.write(0, torch.tensor([0], device=k.device), k, asm.cache.values[0, :, :, :1].clone())
    visual = _visual_choice(asm)
    _, computed = runtime.reuse.refresh(asm, visual)
    assert torch.equal(computed, torch.cat([asm.fresh_text_rows(), visual]).unique())
    assert not asm.text_from_one


def test_int8_pages_recompute_layer_zero_of_the_text_rows(runtime: ReuseRuntime) -> None:
    """Int8 page K/V are not exact at layer 0, so the refreshed rows' fresh layer-0 K/V
    differ from what the scoring pass read: the text rows then run from layer 0 again."""
    fast, slow = _assemble(runtime, int8=True), _assemble(runtime, int8=True)
    assert not fast.layer0_exact
    runtime.reuse.scoring(fast)
    runtime.reuse.scoring(slow)
    slow.stale = None
    visual = _visual_choice(fast)
    hidden, _ = runtime.reuse.refresh(fast, visual)
    assert not fast.text_from_one
    torch.testing.assert_close(hidden, runtime.reuse.refresh(slow, visual)[0], **tol("hidden"))
