"""Prometheus metrics: HTTP responses by route template and status, request outcomes and
answer latency/compute, plus what is read at scrape time: the page-KV tiers' hit/miss counters
and, in the distributed form, the jobs waiting in the broker's queues."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from re import Pattern

from fastapi.routing import iter_route_contexts
from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute, Mount, compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from storage.errors import UnavailableError
from storage.kv.tiered import TieredKVStore

log = logging.getLogger(__name__)

HTTP_REQUESTS = Counter("conduit_http_requests", "HTTP responses by route template, method "
                        "and status code", ["route", "method", "status"])
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


UNMATCHED_ROUTE = "<unmatched>"  # the route label of a path no route serves (no raw paths)
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@dataclass(frozen=True)
class RouteTemplate:
    """One route as the metrics name it: its path template, the regex of the paths it
    serves, and its methods (None: any, as a mount)."""

    template: str
    regex: Pattern[str]
    methods: frozenset[str] | None


def route_templates(routes: Sequence[BaseRoute]) -> list[RouteTemplate]:
    """The app's routes in matching order, included routers flattened with their prefixes
    (a mount's template is its prefix then `/{path}`)."""
    out = []
    for route in iter_route_contexts(routes):
        path = route.path or ""
        mount = isinstance(route.original_route, Mount)
        template = path.rstrip("/") + "/{path}" if mount else path
        regex, _, _ = compile_path(path.rstrip("/") + "/{path:path}" if mount else path)
        methods = None if route.methods is None else frozenset(route.methods)
        out.append(RouteTemplate(template, regex, methods))
    return out


def route_template(templates: Sequence[RouteTemplate], path: str, method: str) -> str:
    """The template of the first route serving `method` on `path`; else of the first route
    serving `path` by another method (the router's 405); else `UNMATCHED_ROUTE`."""
    other = None
    for route in templates:
        if route.regex.match(path):
            if route.methods is None or method in route.methods:
                return route.template
            other = other or route.template
    return other or UNMATCHED_ROUTE


class HTTPMetricsMiddleware:
    """Counts every HTTP response in `conduit_http_requests_total` by route template, method
    (other methods as OTHER) and status code, when its status is sent. A request whose
    handler raises before responding counts as the 500 the server then sends. Installed
    outermost, it also counts the refusals the middlewares inside it answer (401, 403, 413),
    under the route the path would have reached. `routes()` is read at the first request:
    routes added later are not named."""

    def __init__(self, app: ASGIApp, routes: Callable[[], Sequence[BaseRoute]]) -> None:
        self.app = app
        self._routes = routes
        self._templates: list[RouteTemplate] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; count its response's status."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._templates is None:
            self._templates = route_templates(self._routes())
        method = scope["method"] if scope["method"] in _METHODS else "OTHER"
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        route = route_template(self._templates, path, method)
        status: int | None = None

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start" and status is None:
                status = int(message["status"])
                HTTP_REQUESTS.labels(route, method, str(status)).inc()
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except BaseException:
            if status is None:
                HTTP_REQUESTS.labels(route, method, "500").inc()
            raise


class QueueLengthCollector(Collector):
    """Exports `conduit_celery_queue_length{queue}`: the jobs waiting in each broker queue,
    read (`lengths()`) at each scrape. A broker that cannot be read leaves the family out of
    that scrape rather than failing it."""

    def __init__(self, lengths: Callable[[], dict[str, int]]) -> None:
        self._lengths = lengths

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One gauge family, labelled by queue name."""
        try:
            lengths = self._lengths()
        except UnavailableError as exc:
            log.warning("queue lengths not read for /metrics: %s", exc)
            return
        gauge = GaugeMetricFamily("conduit_celery_queue_length", "Jobs waiting in a broker "
                                  "queue for a worker (the Redis lists KEDA watches)",
                                  labels=["queue"])
        for queue, length in sorted(lengths.items()):
            gauge.add_metric([queue], length)
        yield gauge


def register_queue_collector(lengths: Callable[[], dict[str, int]]) -> QueueLengthCollector:
    """Register the broker queue collector on the default registry (undo with `unregister`)."""
    collector = QueueLengthCollector(lengths)
    REGISTRY.register(collector)
    return collector
