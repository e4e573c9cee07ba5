"""Loading for a GPU: weights placed on the device as they load, attention implementations
other than sdpa and eager refused with a clear error, and the checkpoint digest kept off the
question path (memoised by file stat, computed while the weights load)."""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import pytest
import torch

from conduit_core.errors import UnsupportedModelError
from conduit_core.model import loader
from conduit_core.model.adapters.base import SUPPORTED_ATTENTION
from conduit_core.model.loader import load_vlm
from conduit_core.passes.layer_forward import forward_rows
from conduit_core.runtime import ReuseRuntime
from lab import answering
from tests.core.conftest import load_builtin
from tests.device import TEST_DEVICE


@pytest.mark.parametrize("impl", ["flash_attention_2", "flex_attention", "paged|sdpa"])
def test_other_attention_implementations_are_refused_before_loading(
        impl: str, model_cache: Path) -> None:
    assert SUPPORTED_ATTENTION == ("sdpa", "eager")
    with pytest.raises(UnsupportedModelError, match=r"not supported.*sdpa and eager"):
        load_vlm("builtin:tiny-qwen2-vl", cache_dir=model_cache, attn_implementation=impl)


def test_a_model_switched_to_another_attention_is_refused(model_cache: Path) -> None:
    vlm = load_builtin("builtin:tiny-internvl", model_cache)
    model = copy.deepcopy(vlm.model)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(UnsupportedModelError, match="flex_attention"):
        type(vlm.adapter)(model, vlm.processor, vlm.tokenizer, vlm.adapter.max_image_tokens)
    rt = ReuseRuntime(vlm)  # and a switch after the adapter was built: refused at run time
    asm = answering.assemble_fresh(rt, "", [], "What?")
    vlm.model.config._attn_implementation = "flex_attention"
    try:
        with pytest.raises(UnsupportedModelError, match="flex_attention"):
            forward_rows(rt.adapter, asm.cache, asm.embeds[:2].unsqueeze(0), torch.arange(2),
                         asm.layout.position_ids[:, :2].unsqueeze(1), n_keys=2)
    finally:
        vlm.model.config._attn_implementation = "sdpa"


def test_weights_are_placed_on_the_device_as_they_load(model_cache: Path) -> None:
    """With accelerate installed, `from_pretrained` gets a device map of the target device
    (no CPU copy of a GPU model); every parameter and buffer ends up there."""
    placement = loader._placement(TEST_DEVICE)
    if placement:
        assert placement == {"device_map": {"": torch.device(TEST_DEVICE)}}
    vlm = load_builtin("builtin:tiny-qwen2-vl", model_cache)
    want = torch.device(TEST_DEVICE).type
    assert all(p.device.type == want for p in vlm.model.parameters())
    assert all(b.device.type == want for b in vlm.model.buffers())


def test_checkpoint_digest_is_memoised_by_file_stat(model_cache: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    load_builtin("builtin:tiny-qwen2-vl", model_cache)
    folder = tmp_path / "ckpt"
    shutil.copytree(model_cache / "tiny-qwen2-vl", folder)
    hashed: list[int] = []
    real = loader._file_digest
    monkeypatch.setattr(loader, "_file_digest",
                        lambda paths: hashed.append(len(paths)) or real(paths))
    first = loader._weights_digest(folder, tmp_path / "cache")
    assert loader._weights_digest(folder, tmp_path / "cache") == first and len(hashed) == 1
    vlm = load_vlm(str(folder), cache_dir=tmp_path / "cache", max_image_tokens=16)
    assert vlm.fingerprint.revision == first and len(hashed) == 1  # a load reads the memo
    weights = next(folder.glob("*.safetensors"))
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert loader._weights_digest(folder, tmp_path / "cache") == first and len(hashed) == 2
