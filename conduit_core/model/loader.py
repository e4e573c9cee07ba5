"""Load a VLM (builtin, local folder or hub id) with its processor, adapter and fingerprint.

Builtins are materialised once under `cache_dir/<name>`; a local path or hub id loads with
its family's transformers class, dtype and device honoured. Unsupported architectures and
attention implementations other than sdpa and eager raise `UnsupportedModelError` before any
weight is read; an unreadable source (missing folder, hub id not cached while offline)
raises `ModelLoadError`. Weights are placed on the device as they load (`device_map`, with
`accelerate` installed; without it they load on the CPU and move, with a warning).

The fingerprint guards cached pages: its revision is the hub commit when known, else a
sha256 of the weight files, memoised in cache_dir by file path, size and mtime and, on a
first load, computed in a thread while the weights load (a worker that loads its model at
startup never hashes on a question's path); its template version includes
`max_image_tokens`. Once placed, each layer's q/k/v and gate/up projections are fused
(`VLMAdapter.fuse_projections`: the model's own forward is unchanged).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PreTrainedModel
from transformers.utils import logging as hf_logging

from conduit_core.errors import ConduitCoreError, ModelLoadError
from conduit_core.model.adapters.base import SUPPORTED_ATTENTION, VLMAdapter, check_attention
from conduit_core.model.builtin import (
    BUILTIN_PAGE_TOKENS,
    BUILTIN_SCHEME,
    is_builtin,
    materialise_builtin,
)
from conduit_core.model.families import family_for
from conduit_core.page_kv import ModelFingerprint

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_BUILTIN_MAX_IMAGE_TOKENS = 16
_DEFAULT_MAX_IMAGE_TOKENS = 256


@dataclass
class LoadedVLM:
    """A loaded model with everything the runtime needs."""

    name: str
    model: PreTrainedModel
    processor: Any
    tokenizer: Any
    adapter: VLMAdapter
    fingerprint: ModelFingerprint
    device: torch.device
    dtype: torch.dtype


def _file_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        with p.open("rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def _weights_digest(folder: Path, cache_dir: Path) -> str:
    """sha256 over the weight files, memoised in cache_dir by (path, size, mtime)."""
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not files:
        raise ConduitCoreError(f"no weight files in {folder}")
    key = json.dumps([[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files])
    memo_path = cache_dir / "weight_digests.json"
    memo: dict[str, str] = json.loads(memo_path.read_text()) if memo_path.is_file() else {}
    if key not in memo:
        memo[key] = "sha256:" + _file_digest(files)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = memo_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(memo))
        tmp.replace(memo_path)
    return memo[key]


def _placement(device: str) -> dict[str, Any]:
    """`from_pretrained` keywords that put every weight on `device` as it is read."""
    if importlib.util.find_spec("accelerate") is not None:
        return {"device_map": {"": torch.device(device)}}
    if torch.device(device).type != "cpu":
        log.warning("accelerate is not installed: the weights load on the CPU and then move "
                    "to %s (peak host memory: the whole model)", device)
    return {}


def _config_hash(config: Any) -> str:
    blob = json.dumps(config.to_diff_dict(), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def load_vlm(
    name_or_path: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    cache_dir: Path,
    max_image_tokens: int | None = None,
    attn_implementation: str = "sdpa",
) -> LoadedVLM:
    """Load `name_or_path` (a `builtin:` name, a local folder or a hub id); see module doc.

    `max_image_tokens` bounds the visual tokens of one page (default 16 for builtins, 256
    for real checkpoints, 36 for the
    testbed); it is part of the fingerprint's template version.
    """
    if dtype not in DTYPES:
        raise ConduitCoreError(f"dtype {dtype!r} not in {sorted(DTYPES)}")
    if attn_implementation not in SUPPORTED_ATTENTION:
        check_attention(attn_implementation, name_or_path)  # raises, naming what is supported
    cache_dir = Path(cache_dir)
    builtin = is_builtin(name_or_path)
    source = str(materialise_builtin(name_or_path, cache_dir)) if builtin else name_or_path
    if max_image_tokens is None:
        max_image_tokens = (BUILTIN_PAGE_TOKENS.get(name_or_path.removeprefix(BUILTIN_SCHEME),
                                                     _BUILTIN_MAX_IMAGE_TOKENS)
                            if builtin else _DEFAULT_MAX_IMAGE_TOKENS)
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot read a model config from {name_or_path!r}: {exc}") from exc
    family = family_for(config.model_type)
    hf_logging.disable_progress_bar()
    revision = getattr(config, "_commit_hash", None)
    with ThreadPoolExecutor(1, thread_name_prefix="conduit-digest") as pool:
        digest = (pool.submit(_weights_digest, Path(source), cache_dir)
                  if not revision or builtin else None)  # hashed while the weights load
        model = family.model_class.from_pretrained(
            source, dtype=DTYPES[dtype], attn_implementation=attn_implementation,
            **_placement(device)).to(device).eval()
        if digest is not None:
            revision = digest.result()
    processor = family.processor_class.from_pretrained(source)
    adapter = family.adapter_class(model, processor, processor.tokenizer, max_image_tokens)
    adapter.fuse_projections()  # placed and cast for good: q/k/v and gate/up one matmul each
    fingerprint = ModelFingerprint(
        name=name_or_path,
        revision=str(revision),
        dtype=dtype,
        config_hash=_config_hash(config),
        template_version=f"{adapter.template_version}/max_image_tokens={max_image_tokens}",
    )
    return LoadedVLM(name=name_or_path, model=model, processor=processor,
                     tokenizer=processor.tokenizer, adapter=adapter, fingerprint=fingerprint,
                     device=torch.device(device), dtype=DTYPES[dtype])
