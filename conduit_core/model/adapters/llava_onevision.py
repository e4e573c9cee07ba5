"""LLaVA-OneVision adapter (Qwen2 language model, 1-D RoPE).

Each page is encoded as a single image (anyres tiling: base tile + unpadded grid tiles with
newline embeddings), exactly what the model does for a one-image input; the segment is the
`<image>` tokens only. `max_image_tokens` caps the anyres tile budget (`anyres_max_k`, set
on both processor and model config so they agree); the base tile is always present.
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from conduit_core.model.adapters.base import PreparedPage, VLMAdapter


class LlavaOnevisionAdapter(VLMAdapter):
    """Glue for `LlavaOnevisionForConditionalGeneration`."""

    family = "llava-onevision"
    template_version = "chatml-llava-ov-v1"
    rope_axes = 1

    def __init__(self, model: Any, processor: Any, tokenizer: Any, max_image_tokens: int):
        super().__init__(model, processor, tokenizer, max_image_tokens)
        cfg = model.config
        vc = cfg.vision_config
        self.tile_tokens = (int(vc.image_size) // int(vc.patch_size)) ** 2
        configured = int(str(cfg.vision_aspect_ratio).removeprefix("anyres_max_"))
        k = max(1, min(configured, max_image_tokens // self.tile_tokens - 1))
        ratio = f"anyres_max_{k}"
        cfg.vision_aspect_ratio = ratio  # the model and the processor must agree
        processor.vision_aspect_ratio = ratio
        self.image_token_id = int(cfg.image_token_id)

    def prepare_pages(self, images: list[Image.Image]) -> list[PreparedPage]:
        """The processor's own layout of one image per page."""
        pages = []
        for im in images:
            out = self.processor(images=[im.convert("RGB")], text=[self.processor.image_token],
                                 return_tensors="pt")
            ids = out["input_ids"][0]  # (T,)
            size = out["image_sizes"][0]  # (2,) original (h, w)
            tiles = int(out["pixel_values"].shape[1])
            grid = torch.tensor([tiles, int(size[0]), int(size[1])], dtype=torch.long)
            pages.append(PreparedPage(ids, grid, {"pixel_values": out["pixel_values"][0],
                                                  "image_sizes": size}))
        return pages

    def vision_tokens(self, image_grid: torch.Tensor) -> int:
        """Patches entering the tower: tiles * patches per tile."""
        return int(image_grid[0]) * self.tile_tokens

    def _batched_pixels(self, pages: list[PreparedPage]) -> tuple[torch.Tensor, torch.Tensor]:
        tiles = max(int(p.vision_inputs["pixel_values"].shape[0]) for p in pages)
        first = pages[0].vision_inputs["pixel_values"]
        pixels = first.new_zeros(len(pages), tiles, *first.shape[1:])  # (n, tiles, C, H, W)
        for i, p in enumerate(pages):
            px = p.vision_inputs["pixel_values"]
            pixels[i, :px.shape[0]] = px
        sizes = torch.stack([p.vision_inputs["image_sizes"] for p in pages])  # (n, 2)
        return pixels.to(self.device, self.model.dtype), sizes.to(self.device)

    def page_embeds(self, pages: list[PreparedPage]) -> list[torch.Tensor]:
        """Vision tower + projector + anyres packing for all pages at once."""
        pixels, sizes = self._batched_pixels(pages)
        feats = self.model.model.get_image_features(pixels, sizes, return_dict=True).pooler_output
        out = []
        for page, f in zip(pages, feats, strict=True):
            if f.shape[0] != page.token_ids.shape[0]:
                raise ValueError(f"{f.shape[0]} image features for {page.token_ids.shape[0]} "
                                 "image tokens: processor and model disagree")
            out.append(f.to(self.dtype))  # (T, hidden): the segment is image tokens only
        return out

    def position_ids(self, token_ids: torch.Tensor,
                     image_grids: list[torch.Tensor]) -> torch.Tensor:
        """1-D positions: the token index, (1, N)."""
        return torch.arange(token_ids.shape[0], device=self.device).view(1, -1)

    def reference_inputs(self, token_ids: torch.Tensor,
                         pages: list[PreparedPage]) -> dict[str, Any]:
        """input_ids, pixel_values, image_sizes, and batch_num_images = 1 per image so that
        every page gets anyres tiling as in single-image inputs."""
        ids = token_ids.view(1, -1).to(self.device)
        kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if pages:
            pixels, sizes = self._batched_pixels(pages)
            kwargs |= {"pixel_values": pixels, "image_sizes": sizes,
                       "batch_num_images": torch.ones(len(pages), dtype=torch.long)}
        return kwargs
