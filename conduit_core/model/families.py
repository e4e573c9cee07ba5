"""Supported model families: a config's `model_type` decides the model class, processor
class and adapter.

This table is the one place a family is admitted; any other `model_type` raises
`UnsupportedModelError`, before a weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import (
    InternVLForConditionalGeneration,
    LlavaOnevisionForConditionalGeneration,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLForConditionalGeneration,
)

from conduit_core.errors import UnsupportedModelError
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.model.adapters.internvl import InternVLAdapter
from conduit_core.model.adapters.llava_onevision import LlavaOnevisionAdapter
from conduit_core.model.adapters.qwen2_5_vl import Qwen2_5_VLAdapter
from conduit_core.model.adapters.qwen2_vl import Qwen2VLAdapter
from conduit_core.model.processors import (
    ImageOnlyInternVLProcessor,
    ImageOnlyLlavaOnevisionProcessor,
    ImageOnlyQwen2_5_VLProcessor,
    ImageOnlyQwen2VLProcessor,
)


@dataclass(frozen=True)
class Family:
    """How to load and drive one transformers VLM family."""

    model_type: str
    model_class: Any
    processor_class: Any
    adapter_class: type[VLMAdapter]


FAMILIES: dict[str, Family] = {
    "qwen2_vl": Family("qwen2_vl", Qwen2VLForConditionalGeneration, ImageOnlyQwen2VLProcessor,
                       Qwen2VLAdapter),
    "qwen2_5_vl": Family("qwen2_5_vl", Qwen2_5_VLForConditionalGeneration,
                         ImageOnlyQwen2_5_VLProcessor, Qwen2_5_VLAdapter),
    "llava_onevision": Family("llava_onevision", LlavaOnevisionForConditionalGeneration,
                              ImageOnlyLlavaOnevisionProcessor, LlavaOnevisionAdapter),
    "internvl": Family("internvl", InternVLForConditionalGeneration,
                       ImageOnlyInternVLProcessor, InternVLAdapter),
}


def family_for(model_type: str) -> Family:
    """The family for a config's `model_type`, or `UnsupportedModelError`."""
    fam = FAMILIES.get(model_type)
    if fam is None:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported families: "
            f"{', '.join(sorted(FAMILIES))}")
    return fam
