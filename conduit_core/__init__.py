"""conduit_core: document question answering over cached page KV for vision-language models
(the algorithm).

A page is prefilled once and its KV kept (`PageKV`, guarded by its `ModelFingerprint`); a
question assembles its pages' cached KV, refreshes the stale visual tokens its policy picks,
and decodes batched with the other answers (`ReuseRuntime`). The package imports only torch,
transformers, tokenizers, PIL, numpy and safetensors. Its top-level names (the loader, the
runtime, the request and result types, the page seam) are re-exported lazily (PEP 562), so
`import conduit_core.page_kv` stays cheap for storage code. Every error it raises derives
from `conduit_core.errors.ConduitCoreError`.
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
