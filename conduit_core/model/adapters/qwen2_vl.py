"""Qwen2-VL adapter (3-D M-RoPE); Qwen2.5-VL subclasses it.

A page's segment is `<|vision_start|> <|image_pad|>*n <|vision_end|>`, n = t*h*w / merge^2
from its image grid. Positions follow the model's own M-RoPE rule over the whole layout,
computed for all images at once (`mrope_positions`), so that a page's positions, and
therefore its cached keys, are those the model itself would give it.
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
        """The 3-D M-RoPE index of the layout (3, N) int64 on the model's device: the model's
        own rule (`get_rope_index` of Qwen2-VL and Qwen2.5-VL for images), computed on the host
        in a fixed number of tensor operations whatever the number of images
        (`mrope_positions`)."""
        merge = int(self.model.config.vision_config.spatial_merge_size)
        pos = mrope_positions(token_ids.view(-1).cpu(), image_grids, self.image_token_id, merge)
        return pos.to(self.device)  # (3, N)

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


def mrope_positions(token_ids: torch.Tensor, image_grids: list[torch.Tensor],
                    image_token_id: int, merge: int) -> torch.Tensor:
    """Qwen2-VL's M-RoPE position ids (3, N) int64 of one sequence `token_ids` (N,): a text
    token takes the running position p on all three axes and moves it on by one; image i's
    run of `image_token_id` tokens, (t, h, w) = (grid_t, grid_h / merge, grid_w / merge),
    takes p + (its frame, row, column) in (t, h, w) order and moves p on by max(h, w).

    Raises ValueError unless the runs of image tokens are exactly one per grid, in order,
    each of t * h * w tokens. The same integers as the model's own `get_rope_index`
    (tests/core/test_host_parity.py), with one cumulative sum instead of a loop over images.
    """
    ids = token_ids.view(-1).to(torch.long)  # (N,)
    n = int(ids.numel())
    if not image_grids:
        return torch.arange(n).view(1, -1).expand(3, -1)  # (3, N)
    grids = torch.stack([g.view(3).to(torch.long).cpu() for g in image_grids])  # (I, 3)
    frames, height, width = grids[:, 0], grids[:, 1] // merge, grids[:, 2] // merge  # (I,)
    image = ids == image_token_id  # (N,)
    before = torch.cat([image.new_zeros(1), image[:-1]])  # (N,) the previous token's
    after = torch.cat([image[1:], image.new_zeros(1)])  # (N,) the next token's
    starts = torch.nonzero(image & ~before).view(-1)  # (R,) each image run's first token
    ends = torch.nonzero(image & ~after).view(-1)  # (R,) and its last
    if starts.numel() != grids.shape[0] or not bool(
            (ends - starts + 1 == frames * height * width).all()):
        raise ValueError(f"{int(starts.numel())} runs of image tokens do not match the "
                         f"{grids.shape[0]} image grids given (one run of t*h*w tokens each)")
    which = (image & ~before).cumsum(0) - 1  # (N,) image index of each image token
    which = which.clamp_min(0)  # (N,) text tokens take image 0 (their values are unused)
    step = (~image).to(torch.long)  # (N,) a text token moves the position on by one
    step[ends] = torch.maximum(height, width)  # an image, by max(h, w) after its last token
    start = step.cumsum(0) - step  # (N,) the running position before each token
    j = torch.arange(n) - starts[which]  # (N,) index inside its image, (t, h, w) order
    h, w = height[which], width[which]  # (N,)
    grid = torch.stack([j // (h * w), j // w % h, j % w])  # (3, N)
    return start.view(1, -1) + torch.where(image.view(1, -1), grid, 0)  # (3, N)
