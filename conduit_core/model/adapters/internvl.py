"""InternVL adapter (native `InternVLForConditionalGeneration`, Qwen2 LM, 1-D RoPE).

Segment = `<img> <IMG_CONTEXT>*(tiles * image_seq_length) </img>`, tiles from the processor's
dynamic cropping (plus a thumbnail); `max_image_tokens` caps the tiles (`max_patches`).
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from conduit_core.model.adapters.base import PreparedPage, VLMAdapter


class InternVLAdapter(VLMAdapter):
    """Glue for `InternVLForConditionalGeneration`."""

    family = "internvl"
    template_version = "chatml-internvl-v1"
    rope_axes = 1

    def __init__(self, model: Any, processor: Any, tokenizer: Any, max_image_tokens: int):
        super().__init__(model, processor, tokenizer, max_image_tokens)
        self.seq_len = int(processor.image_seq_length)
        configured = int(processor.image_processor.max_patches)
        # k crops plus one thumbnail (added whenever k > 1) must fit the budget
        self.max_patches = max(1, min(configured, max_image_tokens // self.seq_len - 1))
        vc = model.config.vision_config
        self.tower_tokens = (int(vc.image_size[0]) // int(vc.patch_size[0])) ** 2 + 1

    def prepare_pages(self, images: list[Image.Image]) -> list[PreparedPage]:
        """The processor's own layout of one image per page."""
        pages = []
        for im in images:
            out = self.processor(images=[im.convert("RGB")], text=[self.processor.image_token],
                                 max_patches=self.max_patches, return_tensors="pt")
            ids = out["input_ids"][0]  # (T,)
            tiles = int(out["pixel_values"].shape[0])
            grid = torch.tensor([tiles, im.height, im.width], dtype=torch.long)
            pages.append(PreparedPage(ids, grid, {"pixel_values": out["pixel_values"]}))
        return pages

    def vision_tokens(self, image_grid: torch.Tensor) -> int:
        """Tokens entering the tower: tiles * (patches + CLS)."""
        return int(image_grid[0]) * self.tower_tokens

    def page_embeds(self, pages: list[PreparedPage]) -> list[torch.Tensor]:
        """Vision tower + pixel shuffle + projector for all tiles of all pages at once."""
        pixels = torch.cat([p.vision_inputs["pixel_values"] for p in pages])  # (tiles, C, H, W)
        feats = self.model.model.get_image_features(
            pixels.to(self.device, self.model.dtype), return_dict=True).pooler_output
        feats = torch.split(feats, [int(p.image_grid[0]) for p in pages])  # per page
        out = []
        for page, f in zip(pages, feats, strict=True):
            e = self.embed_tokens(page.token_ids)  # (T, hidden)
            e[1:-1] = f.reshape(-1, f.shape[-1]).to(e.dtype)  # between <img> and </img>
            out.append(e)
        return out

    def position_ids(self, token_ids: torch.Tensor,
                     image_grids: list[torch.Tensor]) -> torch.Tensor:
        """1-D positions: the token index, (1, N)."""
        return torch.arange(token_ids.shape[0], device=self.device).view(1, -1)

    def reference_inputs(self, token_ids: torch.Tensor,
                         pages: list[PreparedPage]) -> dict[str, Any]:
        """input_ids and the pages' tiles in order."""
        ids = token_ids.view(1, -1).to(self.device)
        kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if pages:
            pixels = torch.cat([p.vision_inputs["pixel_values"] for p in pages])
            kwargs["pixel_values"] = pixels.to(self.device, self.model.dtype)
        return kwargs
