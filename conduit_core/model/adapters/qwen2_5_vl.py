"""Qwen2.5-VL adapter: Qwen2-VL's segment layout and 3-D M-RoPE index; the vision tower
(windowed attention, gated MLP) is driven through the model's own `get_image_features`.
"""

from __future__ import annotations

from conduit_core.model.adapters.qwen2_vl import Qwen2VLAdapter


class Qwen2_5_VLAdapter(Qwen2VLAdapter):  # noqa: N801 (transformers naming)
    """Glue for `Qwen2_5_VLForConditionalGeneration`."""

    family = "qwen2.5-vl"
    template_version = "chatml-qwen2.5vl-v1"
