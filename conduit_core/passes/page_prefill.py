"""Page prefill: each page once, under the canonical page context, in page batches.

A page's K/V are computed in `layout.page_context` (the template opening, then the page's
segment) with the positions that context gives, pages of a batch right-padded and run
together on the plain causal path; each comes back on the host (`PageKV.to_host`: pinned
where CUDA is available), with its layer-0 embeddings (the vision tower's output) for the
refresh.
"""

from __future__ import annotations

import torch
from PIL import Image

from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.loader import LoadedVLM
from conduit_core.page_kv import PageKV
from conduit_core.passes.layer_forward import forward_rows
from conduit_core.prompt.layout import page_context


@torch.no_grad()
def prefill_pages(vlm: LoadedVLM, images: list[Image.Image], batch_size: int = 8
                  ) -> list[PageKV]:
    """Prefill each page once under the canonical page context (module docstring)."""
    adapter = vlm.adapter
    prepared = adapter.prepare_pages(images) if images else []
    out: list[PageKV] = []
    for i in range(0, len(prepared), batch_size):
        chunk = prepared[i:i + batch_size]
        seg_embeds = adapter.page_embeds(chunk)
        ctxs = [page_context(adapter, p.token_ids, p.image_grid) for p in chunk]
        t_max = max(c.n for c in ctxs)
        hidden_size = seg_embeds[0].shape[-1]
        hidden = torch.zeros(len(chunk), t_max, hidden_size, dtype=adapter.dtype,
                             device=adapter.device)  # (B, T, hidden), right-padded
        pos = torch.zeros(adapter.rope_axes, len(chunk), t_max, dtype=torch.long)
        for b, (ctx, emb) in enumerate(zip(ctxs, seg_embeds, strict=True)):
            seg = ctx.segments[0]
            hidden[b, :seg.start] = adapter.embed_tokens(ctx.token_ids[:seg.start])
            hidden[b, seg.start:seg.stop] = emb
            pos[:, b, :ctx.n] = ctx.position_ids  # (P, T)
        cache = KVCache.allocate(adapter, len(chunk), t_max)
        rows = torch.arange(t_max, device=adapter.device)
        forward_rows(adapter, cache, hidden, rows, pos, n_keys=t_max, plain_causal=True)
        for b, (ctx, emb, page) in enumerate(zip(ctxs, seg_embeds, chunk, strict=True)):
            seg = ctx.segments[0]
            out.append(PageKV(
                embeds=emb.clone(),  # (T, hidden)
                keys=cache.keys[:, b, :, seg.start:seg.stop].clone(),  # (L, kv, T, hd)
                values=cache.values[:, b, :, seg.start:seg.stop].clone(),  # (L, kv, T, hd)
                position_ids=ctx.position_ids[:, seg.start:seg.stop].clone(),  # (P, T)
                token_ids=page.token_ids.clone(),
                image_grid=page.image_grid.clone(),
                fingerprint=vlm.fingerprint,
            ).to_host())
    return out
