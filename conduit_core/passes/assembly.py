"""An assembled request: the layout, its KV cache and the passes' shared state.

The runtime's steps build it from cached pages (`conduit_core.reuse_steps`), the lab from
images (`lab.answering.assemble_fresh`); the scoring pass records itself on it (`stale`,
`stale_writes`) so that the refresh can reuse what that pass computed while nothing has
written to the cache since.

The rows exact before any pass are the cached head's (`exact_rows`); every pass computes
the text rows after it (`fresh_text_rows`). What an answer reports of how much the question
looked at each page is decided here (`page_attention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from conduit_core.kv.kv_cache import KVCache
from conduit_core.passes.prompt_head import HeadKV
from conduit_core.passes.stale_pass import StaleScores
from conduit_core.prompt.layout import Layout


@dataclass
class Assembly:
    """An assembled request: layout, its KV cache (B = 1) and layer-0 embeddings."""

    layout: Layout
    cache: KVCache  # (L, 1, kv_heads, capacity, hd); page rows hold re-rotated stale K/V
    embeds: torch.Tensor  # (N, hidden)
    image_grids: list[torch.Tensor]
    stale: StaleScores | None = None  # the scoring pass run on this cache, if any
    stale_writes: int = -1  # cache.writes right after that pass
    head: HeadKV | None = None  # the cached head, copied into rows [0, head.n)
    last_only: bool = False  # passes return the last row's last-layer state only (answers)
    layer0_exact: bool = True  # page K/V exact at layer 0 (False: some page came as int8)
    text_from_one: bool = False  # the last refresh took its text rows' layer 0 from `stale`
    namespace: str = ""  # the pages' namespace: the key of every cache it reads or fills
    fill_flops: float = 0.0  # LM FLOPs of the head and page labels computed for it (misses)
    labels_pending: bool = False  # stale label rows not filled yet (`ReuseSteps.load_labels`)

    @property
    def exact_rows(self) -> int:
        """Leading rows whose K/V are exact before any pass (the cached head)."""
        return self.head.n if self.head is not None else 0

    def fresh_text_rows(self) -> torch.Tensor:
        """Text rows a pass computes: those after the cached head, ascending (N_t',), on the
        host (numpy arithmetic on the layout's rows)."""
        text = self.layout.text_rows().numpy()  # (N_t,)
        return torch.from_numpy(text[text >= self.exact_rows])

    def page_attention(self) -> tuple[float, ...]:
        """How much the question looked at each page in the scoring pass: the page's most
        attended token (the raw attention part of CONDUIT's score), normalised over the pages
        to sum to 1, in page order; empty when no scoring pass ran or it gave the pages no
        attention. The peak, not the page's total: a question's attention is spread thinly
        over every token and sharply on the few it reads, and only the peak tells the page
        it read (measured: lab/testbed/NOTES.md, "Citations")."""
        if self.stale is None or not self.layout.segments:
            return ()
        attention = self.stale.attention.float().cpu().numpy()  # (N,) host arithmetic
        totals = [-math.inf] * len(self.layout.segments)  # (M,) each page's most attended token
        for s in self.layout.segments:
            if s.length:
                totals[s.page] = max(totals[s.page], float(attention[s.start:s.stop].max()))
        whole = sum(totals)
        return tuple(t / whole for t in totals) if whole > 0 else ()
