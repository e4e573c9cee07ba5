"""Qwen2-VL adapter (3-D M-RoPE); Qwen2.5-VL subclasses it.

Public API:
  Qwen2VLAdapter(model, processor, tokenizer, max_image_tokens)
    segment = <|vision_start|> <|image_pad|>*n <|vision_end|>, n = t*h*w / merge^2;
    positions from the model's own `get_rope_index` (3, N).
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from conduit_core.model.adapters.base import PreparedPage, VLMAdapter


class Qwen2VLAdapter(VLMAdapter):
    """Glue for `Qwen2VLForConditionalGeneration`."""

    family = "qwen2-vl"
    template_version = "chatml-qwen2vl-v1"
    rope_axes = 3

    def __init__(self, model: Any, processor: Any, tokenizer: Any, max_image_tokens: int):
        super().__init__(model, processor, tokenizer, max_image_tokens)
        cfg = model.config
        self.image_token_id = int(cfg.image_token_id)
        self.vision_start_id = int(cfg.vision_start_token_id)
        self.vision_end_id = int(cfg.vision_end_token_id)
        ip = processor.image_processor
        self.merge = int(ip.merge_size)
        factor = int(ip.patch_size) * self.merge
        self.image_kwargs = {"size": {"shortest_edge": min(4, max_image_tokens) * factor * factor,
                                      "longest_edge": max_image_tokens * factor * factor}}

    def prepare_pages(self, images: list[Image.Image]) -> list[PreparedPage]:
        """Resize/patchify each page (bounded to `max_image_tokens`) and lay out its segment."""
        out = self.processor.image_processor(
            images=[im.convert("RGB") for im in images], return_tensors="pt", **self.image_kwargs
        )
        grids = out["image_grid_thw"]  # (n, 3)
        sizes = (grids.prod(-1)).tolist()  # patches per image
        pixels = torch.split(out["pixel_values"], sizes)  # per image (patches, C*p*p*tp)
        pages = []
        for grid, px in zip(grids, pixels, strict=True):
            n = int(grid.prod()) // (self.merge**2)
            ids = torch.tensor([self.vision_start_id] + [self.image_token_id] * n
                               + [self.vision_end_id], dtype=torch.long)  # (T,)
            pages.append(PreparedPage(ids, grid.clone(), {"pixel_values": px}))
        return pages

    def vision_tokens(self, image_grid: torch.Tensor) -> int:
        """Patches entering the vision tower: t * h * w."""
        return int(image_grid.prod())

    def page_embeds(self, pages: list[PreparedPage]) -> list[torch.Tensor]:
        """Vision tower + merger for all pages at once; scatter into the segment embeddings."""
        pixels = torch.cat([p.vision_inputs["pixel_values"] for p in pages]).to(self.device)
        grids = torch.stack([p.image_grid for p in pages]).to(self.device)  # (n, 3)
        feats = self.model.model.get_image_features(pixels, grids, return_dict=True).pooler_output
        embeds = []
        for page, f in zip(pages, feats, strict=True):
            e = self.embed_tokens(page.token_ids)  # (T, hidden)
            e[1:-1] = f.to(e.dtype)  # image tokens sit between the two delimiters
            embeds.append(e)
        return embeds

    def position_ids(self, token_ids: torch.Tensor,
                     image_grids: list[torch.Tensor]) -> torch.Tensor:
        """The model's own 3-D M-RoPE index of the layout: (3, N)."""
        ids = token_ids.view(1, -1).to(self.device)  # (1, N)
        if not image_grids:
            return torch.arange(ids.shape[1], device=self.device).view(1, -1).expand(3, -1)
        mm = (ids == self.image_token_id).to(torch.int)  # (1, N)
        grids = torch.stack(image_grids).to(self.device)  # (n, 3)
        pos, _ = self.model.model.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=grids)
        return pos[:, 0]  # (3, N)

    def reference_inputs(self, token_ids: torch.Tensor,
                         pages: list[PreparedPage]) -> dict[str, Any]:
        """input_ids, pixel_values, image_grid_thw, mm_token_type_ids for the model itself."""
        ids = token_ids.view(1, -1).to(self.device)
        kwargs: dict[str, Any] = {"input_ids": ids,
                                  "mm_token_type_ids": (ids == self.image_token_id).to(torch.int),
                                  "attention_mask": torch.ones_like(ids)}
        if pages:
            kwargs["pixel_values"] = torch.cat([p.vision_inputs["pixel_values"] for p in pages])
            kwargs["pixel_values"] = kwargs["pixel_values"].to(self.device)
            kwargs["image_grid_thw"] = torch.stack([p.image_grid for p in pages]).to(self.device)
        return kwargs
