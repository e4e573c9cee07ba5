"""Cached page labels: a label's K/V computed once after the prompt head, reused stale.

A request places a short label before each page (`[report.pdf p.3]`, about 13 tokens with the
chat template's tokenizer). Without this cache every label is a text row: computed in the
scoring pass and again in the refresh, and labels are most of the text rows after the head
(docs/DECISIONS.md). With it, a label is treated like its page: its K/V are computed once,
right after the prompt head (the label's exact context when it is the first one, and the
context every label shares), kept here by (head, label) token ids, and re-rotated into place in
each assembled cache (`conduit_core.prompt.rotation`: RoPE composes, so only the position shift
changes). A label is then stale in both passes, exactly like the page tokens around it: its
layer-0 K/V are exact (they depend only on the token and its position), its deeper K/V miss the
pages that precede it in the question (the first label, right after the head, misses nothing:
it is exact). The refresh recomputes a stale label with its whole page, or, with the runtime's
`label_refresh` "always" / "budget", every stale one (`Layout.refreshed_label_rows`), so a
refresh of every page token, the fallback to a full prefill, stays exact.

Entries are keyed by the request's page namespace (a tenant, or the shared corpus) with the
head's and the label's token ids: labels carry file names, and whether one is cached must
never tell one tenant what another uploaded. Entries live with the loaded model (a restarted
process rebuilds them on first use) in a bounded LRU. An answer fills its label rows after
the cost model has planned it (`ReuseSteps.load_labels`): a miss is computed then and
charged to that answer (`Assembly.fill_flops`; not computed = not charged) but never decides
its path, and an answer that recomputes a label's page whole (a full prefill, the fallback)
never computes the label here.

An answer fills its pending label rows through `load_labels`; `fetch` gives one label's K/V,
computing it on a miss, with the FLOPs that cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from conduit_core.cost.cost_model import RowCosts
from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.adapters.base import VLMAdapter
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.layer_forward import forward_rows
from conduit_core.passes.prompt_head import HeadKV
from conduit_core.prompt.bounded_lru import BoundedLRU
from conduit_core.prompt.layout import Segment
from conduit_core.prompt.rotation import rerotate_into, shift_tables, span_deltas

LabelKey = tuple[str, tuple[int, ...], tuple[int, ...]]  # (namespace, head ids, label ids)


@dataclass(frozen=True)
class LabelKV:
    """A label's K/V per layer, computed right after its head, at the positions given."""

    key: LabelKey
    keys: torch.Tensor  # (L, kv_heads, t, hd), after RoPE at `position_ids`
    values: torch.Tensor  # (L, kv_heads, t, hd)
    position_ids: torch.Tensor  # (P, t) on the host: the positions the keys were rotated to

    @property
    def n(self) -> int:
        """Tokens in the label."""
        return len(self.key[2])


class LabelCache(BoundedLRU[LabelKey, LabelKV]):
    """Bounded LRU of computed page labels for one loaded model."""

    def __init__(self, max_entries: int = 1024):
        super().__init__(max_entries)

    @staticmethod
    def key(namespace: str, head: HeadKV, label_ids: torch.Tensor) -> LabelKey:
        """The entry key of a label (t,) after `head` in `namespace`."""
        return namespace, head.token_ids, tuple(int(t) for t in label_ids.tolist())

    @torch.no_grad()
    def get(self, adapter: VLMAdapter, namespace: str, head: HeadKV,
            label_ids: torch.Tensor) -> tuple[LabelKV, bool]:
        """The label with token ids `label_ids` (t,) after `head` in `namespace`, and whether
        it was computed now (at the positions of a prompt whose first label it is)."""
        key = self.key(namespace, head, label_ids)
        return self.get_or_compute(key, lambda: _compute(adapter, head, key, label_ids))


def _compute(adapter: VLMAdapter, head: HeadKV, key: LabelKey,
             label_ids: torch.Tensor) -> LabelKV:
    h, t = head.n, len(key[2])
    position_ids = adapter.position_ids(
        torch.cat([torch.tensor(head.token_ids, dtype=torch.long), label_ids.cpu()]), [])
    cache = KVCache.allocate(adapter, 1, h + t)
    head.copy_into(cache)
    embeds = adapter.embed_tokens(label_ids.to(torch.long)).unsqueeze(0)  # (1, t, hidden)
    rows = torch.arange(h, h + t)
    pos = position_ids[:, h:h + t]  # (P, t)
    forward_rows(adapter, cache, embeds, rows.to(adapter.device), pos.unsqueeze(1),
                 n_keys=h + t, outputs=torch.tensor([t - 1]))  # only K/V are kept
    return LabelKV(key=key, keys=cache.keys[:, 0, :, h:].clone(),  # (L, kv, t, hd)
                   values=cache.values[:, 0, :, h:].clone(),
                   position_ids=pos.cpu())  # host: an answer reads them to turn the keys


def _pending(assembly: Assembly, skip: torch.Tensor | None) -> list[tuple[Segment, torch.Tensor]]:
    """The label spans an assembly still has to fill and their token ids, less those in
    rows `skip` (the refresh recomputes them)."""
    if not assembly.labels_pending:
        return []
    layout = assembly.layout
    skipped = set() if skip is None else set(skip.tolist())
    return [(s, layout.token_ids[s.start:s.stop]) for s in layout.labels
            if s.start not in skipped]


def _cost(costs: RowCosts, head: HeadKV, t: int) -> float:
    """A label of t tokens computed after `head` (its last layer trimmed, as `_compute`)."""
    return costs.rows(torch.arange(head.n, head.n + t), head.n + t, last_only=True)


def load_labels(cache: LabelCache, adapter: VLMAdapter, costs: RowCosts, assembly: Assembly,
                skip: torch.Tensor | None = None) -> None:
    """Write the assembly's pending labels' K/V into their rows, turned to their places,
    computing the labels the cache lacks (their FLOPs added to `assembly.fill_flops`)."""
    pending = _pending(assembly, skip)
    assembly.labels_pending = False
    if not pending:
        return
    head = assembly.head
    assert head is not None  # stale labels are computed after the head
    labels = []
    for _, ids in pending:
        label, spent = fetch(cache, adapter, costs, assembly.namespace, head, ids)
        labels.append(label)
        assembly.fill_flops += spent
    write_labels(adapter, assembly.cache, [span for span, _ in pending], labels,
                 assembly.layout.position_ids)


def write_labels(adapter: VLMAdapter, cache: KVCache, spans: list[Segment],
                 labels: list[LabelKV], position_ids: torch.Tensor) -> None:
    """Write each label's K/V into its span of a batch-1 cache, its keys turned to the
    layout's `position_ids` (P, N) there: all labels at once (one table of shifts, one
    rotation pass, one indexed copy each for keys and values), the same values as turning
    them one by one (`rotation.rerotate_into` with each label's own shift). Raises
    ConduitCoreError where a label's positions do not shift uniformly."""
    if not spans:
        return
    lengths = [s.length for s in spans]
    rows = np.concatenate([np.arange(s.start, s.stop) for s in spans])  # (T,)
    cached = torch.cat([label.position_ids for label in labels], dim=1).cpu()  # (P, T)
    deltas = span_deltas(cached, position_ids.cpu()[:, torch.from_numpy(rows)], lengths)
    dev = cache.keys.device
    cos, sin = shift_tables(adapter, deltas, lengths, dev)  # (T, hd) each
    keys = torch.cat([label.keys for label in labels], dim=2)  # (L, kv, T, hd)
    turned = torch.empty(keys.shape, dtype=cache.keys.dtype, device=dev)  # (L, kv, T, hd)
    rerotate_into(keys, cos, sin, turned)
    index = torch.from_numpy(rows).to(dev)  # (T,)
    cache.keys[:, 0].index_copy_(2, index, turned)  # (L, kv, N, hd)
    values = torch.cat([label.values for label in labels], dim=2)  # (L, kv, T, hd)
    cache.values[:, 0].index_copy_(2, index, values.to(cache.values.dtype))


def fetch(cache: LabelCache, adapter: VLMAdapter, costs: RowCosts, namespace: str,
          head: HeadKV, label_ids: torch.Tensor) -> tuple[LabelKV, float]:
    """The label (t,) after `head` in `namespace` from the cache, computed if missing, and
    the LM FLOPs that took (0 on a hit)."""
    label, computed = cache.get(adapter, namespace, head, label_ids)
    return label, _cost(costs, head, label.n) if computed else 0.0
