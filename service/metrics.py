"""Prometheus metrics: request outcomes and answer latency/compute, plus the page-KV tiers'
hit/miss counters read from the store at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from storage.kv.tiered import TieredKVStore

QUERIES = Counter("conduit_queries_total", "Questions answered", ["policy", "outcome"])
UPLOADS = Counter("conduit_uploads_total", "Uploads by outcome", ["outcome"])
TTFT = Histogram("conduit_ttft_seconds", "Time to first token inside the runtime",
                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
ANSWER_SECONDS = Histogram("conduit_answer_seconds", "Whole answer latency (retrieve to last "
                           "token)", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
FALLBACKS = Counter("conduit_reuse_fallbacks_total", "Answers whose policy was predicted to "
                    "cost more than a full prefill from cached page embeddings, which ran "
                    "instead", ["policy"])
FLOPS_RATIO = Histogram("conduit_flops_ratio_lm", "Language-model prefill FLOPs spent "
                        "relative to a full prefill",
                        buckets=(0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0))


class KVTierCollector(Collector):
    """Exports each KV tier's counters (hits, misses, evictions, corrupt, errors) and size."""

    def __init__(self, kv: TieredKVStore) -> None:
        self._kv = kv

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """One metric family per counter, labelled by tier."""
        stats = self._kv.tier_stats()
        for field in ("hits", "misses", "evictions", "corrupt", "errors"):
            family = CounterMetricFamily(f"conduit_kv_{field}", f"Page-KV tier {field}",
                                         labels=["tier"])
            for tier, s in stats.items():
                family.add_metric([tier], getattr(s, field))
            yield family
        for field in ("bytes", "entries"):
            gauge = GaugeMetricFamily(f"conduit_kv_{field}", f"Page-KV tier {field} held",
                                      labels=["tier"])
            for tier, s in stats.items():
                if getattr(s, field) >= 0:  # -1: not counted (Redis: counting is a scan)
                    gauge.add_metric([tier], getattr(s, field))
            yield gauge


def register_kv_collector(kv: TieredKVStore) -> KVTierCollector:
    """Register the tier collector on the default registry (undo with `unregister`)."""
    collector = KVTierCollector(kv)
    REGISTRY.register(collector)
    return collector
