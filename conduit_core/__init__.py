"""conduit_core: document QA over cached page KV for vision-language models (the algorithm).

Imports only torch, transformers, tokenizers, PIL, numpy and safetensors. Names below are
re-exported lazily (PEP 562), so `import conduit_core.page_kv` stays cheap for storage code.

Public API (re-exported here):
  load_vlm(name_or_path, *, device="cpu", dtype="float32", cache_dir, max_image_tokens=None,
           attn_implementation="sdpa") -> LoadedVLM
  LoadedVLM       .model, .processor, .tokenizer, .adapter, .fingerprint, .device, .dtype
  ReuseRuntime    pages prefilled once; an answer's prefill in phases over cached pages,
                  then batched decode steps (`conduit_core.runtime`)
  AnswerRequest, AnswerResult, PageInput       typed request/result (conduit_core.answer_types)
  PageKV, ModelFingerprint                     the seam to storage (conduit_core.page_kv)
  builtin_names() -> list[str]                 "builtin:tiny-qwen2-vl", ...
Errors derive from `conduit_core.errors.ConduitCoreError`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conduit_core.answer_types import AnswerRequest, AnswerResult, PageInput
    from conduit_core.model.builtin import builtin_names
    from conduit_core.model.loader import LoadedVLM, load_vlm
    from conduit_core.page_kv import ModelFingerprint, PageKV
    from conduit_core.runtime import ReuseRuntime

_EXPORTS = {
    "AnswerRequest": "conduit_core.answer_types",
    "AnswerResult": "conduit_core.answer_types",
    "PageInput": "conduit_core.answer_types",
    "builtin_names": "conduit_core.model.builtin",
    "LoadedVLM": "conduit_core.model.loader",
    "load_vlm": "conduit_core.model.loader",
    "ModelFingerprint": "conduit_core.page_kv",
    "PageKV": "conduit_core.page_kv",
    "ReuseRuntime": "conduit_core.runtime",
}

__all__ = [
    "AnswerRequest",
    "AnswerResult",
    "LoadedVLM",
    "ModelFingerprint",
    "PageInput",
    "PageKV",
    "ReuseRuntime",
    "builtin_names",
    "load_vlm",
]


def __getattr__(name: str) -> Any:
    """Import a re-exported name on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'conduit_core' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
