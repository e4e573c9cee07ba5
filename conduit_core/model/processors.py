"""Image-only processors: the families' processors without their video processors.

The stock processors require a video processor, which needs torchvision (not installed: it
pulls a CUDA torch). These subclasses drop that argument and inherit everything else; the
family options they take are saved with them, so a saved processor loads back the same.
"""

from __future__ import annotations

from typing import Any

from transformers import (
    InternVLProcessor,
    LlavaOnevisionProcessor,
    Qwen2_5_VLProcessor,
    Qwen2VLProcessor,
)


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """`Qwen2VLProcessor` without a video processor."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                 chat_template: str | None = None, **kwargs: Any):
        super().__init__(image_processor=image_processor, tokenizer=tokenizer,
                         video_processor=None, chat_template=chat_template, **kwargs)


class ImageOnlyQwen2_5_VLProcessor(Qwen2_5_VLProcessor):  # noqa: N801 (transformers naming)
    """`Qwen2_5_VLProcessor` without a video processor."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                 chat_template: str | None = None, **kwargs: Any):
        super().__init__(image_processor=image_processor, tokenizer=tokenizer,
                         video_processor=None, chat_template=chat_template, **kwargs)


class ImageOnlyLlavaOnevisionProcessor(LlavaOnevisionProcessor):
    """`LlavaOnevisionProcessor` without a video processor."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                 num_image_tokens: int | None = None,
                 vision_feature_select_strategy: str | None = None,
                 chat_template: str | None = None, image_token: str = "<image>",
                 video_token: str = "<video>", vision_aspect_ratio: str = "anyres_max_9",
                 **kwargs: Any):
        super().__init__(image_processor=image_processor, tokenizer=tokenizer,
                         video_processor=None, num_image_tokens=num_image_tokens,
                         vision_feature_select_strategy=vision_feature_select_strategy,
                         chat_template=chat_template, image_token=image_token,
                         video_token=video_token, vision_aspect_ratio=vision_aspect_ratio,
                         **kwargs)


class ImageOnlyInternVLProcessor(InternVLProcessor):
    """`InternVLProcessor` without a video processor."""

    def __init__(self, image_processor: Any = None, tokenizer: Any = None,
                 image_seq_length: int = 256, chat_template: str | None = None,
                 **kwargs: Any):
        super().__init__(image_processor=image_processor, tokenizer=tokenizer,
                         video_processor=None, image_seq_length=image_seq_length,
                         chat_template=chat_template, **kwargs)
