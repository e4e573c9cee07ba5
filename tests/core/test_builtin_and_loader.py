"""Builtin models: deterministic, tokenizer ids match the config, vocabulary covered; the
loader refuses unsupported architectures clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conduit_core import builtin_names, load_vlm
from conduit_core.errors import ModelLoadError, UnsupportedModelError
from tests.core.conftest import FAMILIES, load_builtin


def test_builtin_names() -> None:
    from conduit_core.model.builtin_models import BUILDERS

    randoms = [*FAMILIES, "builtin:small-qwen2-vl"]  # the service's default is random too
    assert sorted(builtin_names()) == sorted([*randoms, "builtin:testbed-qwen2-vl"])
    assert sorted("builtin:" + n for n in BUILDERS) == sorted(randoms)


@pytest.mark.parametrize("name", FAMILIES)
def test_tokenizer_matches_config(name: str, model_cache: Path) -> None:
    vlm = load_builtin(name, model_cache)
    cfg, tok = vlm.model.config, vlm.tokenizer
    assert cfg.get_text_config().vocab_size >= len(tok)
    image_token = {"qwen2_vl": "<|image_pad|>", "qwen2_5_vl": "<|image_pad|>",
                   "llava_onevision": "<image>", "internvl": "<IMG_CONTEXT>"}[cfg.model_type]
    assert cfg.image_token_id == tok.convert_tokens_to_ids(image_token)
    assert cfg.get_text_config().eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    pieces = tok.convert_ids_to_tokens(tok("What is the total revenue?").input_ids)
    assert len(pieces) <= 6  # words tokenize sensibly, not byte by byte
    assert tok.decode(tok("the invoice number").input_ids) == "the invoice number"
    assert vlm.processor.chat_template and vlm.fingerprint.name == name


def test_builtin_is_materialised_once_and_deterministic(model_cache: Path,
                                                        tmp_path: Path) -> None:
    a = load_builtin("builtin:tiny-qwen2-vl", model_cache, dtype="float32", device="cpu")
    folder = model_cache / "tiny-qwen2-vl"
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    again = load_vlm("builtin:tiny-qwen2-vl", cache_dir=model_cache)
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime  # not rebuilt
    fresh = load_vlm("builtin:tiny-qwen2-vl", cache_dir=tmp_path)  # built afresh elsewhere
    assert a.fingerprint == again.fingerprint == fresh.fingerprint
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(),
                                  fresh.model.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)


def test_max_image_tokens_bounds_pages_and_enters_the_fingerprint(model_cache: Path) -> None:
    from tests.core.helpers import IMAGES

    small = load_vlm("builtin:tiny-qwen2-vl", cache_dir=model_cache, max_image_tokens=8)
    big = load_builtin("builtin:tiny-qwen2-vl", model_cache, dtype="float32", device="cpu")
    assert small.fingerprint != big.fingerprint
    (page,) = small.adapter.prepare_pages([IMAGES["a"]])
    assert int((page.token_ids == small.model.config.image_token_id).sum()) <= 8


def test_unknown_builtin_and_unsupported_architecture(model_cache: Path, tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="available"):
        load_vlm("builtin:tiny-nope", cache_dir=model_cache)
    folder = tmp_path / "gpt2ish"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(UnsupportedModelError, match="gpt2.*not supported"):
        load_vlm(str(folder), cache_dir=model_cache)
    with pytest.raises(ModelLoadError, match="cannot read a model config"):
        load_vlm(str(tmp_path / "missing"), cache_dir=model_cache)


def test_local_folder_loads_like_a_checkpoint(model_cache: Path) -> None:
    builtin = load_builtin("builtin:tiny-llava-onevision", model_cache, dtype="float32",
                           device="cpu")
    folder = str(model_cache / "tiny-llava-onevision")
    local = load_vlm(folder, cache_dir=model_cache, max_image_tokens=16)
    assert local.fingerprint.name == folder
    assert local.fingerprint.revision == builtin.fingerprint.revision  # weight digest
    assert local.fingerprint.config_hash == builtin.fingerprint.config_hash
    assert type(local.adapter) is type(builtin.adapter)
    for (ka, va), (kb, vb) in zip(local.model.state_dict().items(),
                                  builtin.model.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)


def test_a_builtin_another_process_finished_first_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes materialise the same builtin at once (two Celery workers on one home):
    the one that finishes second keeps the first one's folder, which that process may be
    loading from, instead of replacing it."""
    from conduit_core.model import builtin

    real_build = builtin._build
    won: list[int] = []

    def build_while_another_finishes(short: str, builders: dict) -> tuple:  # type: ignore[type-arg]
        monkeypatch.setattr(builtin, "_build", real_build)
        folder = builtin.materialise_builtin("builtin:tiny-qwen2-vl", tmp_path)  # the other
        won.append(folder.stat().st_ino)
        return real_build(short, builders)
    monkeypatch.setattr(builtin, "_build", build_while_another_finishes)
    folder = builtin.materialise_builtin("builtin:tiny-qwen2-vl", tmp_path)
    assert won and folder.stat().st_ino == won[0]  # the winner's folder, not replaced
    assert (folder / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-qwen2-vl"]  # no temporary left
