"""The one `Settings` object (environment prefix `CONDUIT_`), read by entry points only.

Entry points (the CLI, the FastAPI app factory, the Celery worker) build a `Settings` and pass plain
values down; nothing below `worker` reads the environment.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from conduit_core.policies.choice import DEFAULT_POLICY

_UNLIMITED = " 0 = unlimited."
_PER_TENANT = (" Unset: {keyed} when API keys are configured, unlimited without (one tenant)."
              + _UNLIMITED)


def _cap(default: int, description: str) -> Any:
    """A limit where 0 lifts it: at least 0, its description ending in " 0 = unlimited."."""
    return Field(default, ge=0, description=description + _UNLIMITED)


def _tenant_cap(description: str, keyed: str) -> Any:
    """A per-tenant limit whose default depends on API keys (unset: `keyed` with keys, none
    without) and where 0 lifts it."""
    return Field(None, ge=0, description=description + _PER_TENANT.format(keyed=keyed))


class Settings(BaseSettings):
    """Every knob of a conduit deployment. Unset Redis URL = embedded (one process)."""

    model_config = SettingsConfigDict(env_prefix="CONDUIT_", env_file=None, extra="ignore")

    # model
    model: str = Field(
        "builtin:small-qwen2-vl",
        description="Local path or hub id of a supported VLM, or a builtin model: "
        "builtin:small-qwen2-vl (the default: random weights, pages of up to 512 visual "
        "tokens, sized so that reuse pays off on a CPU), builtin:tiny-* (test sizes), "
        "builtin:testbed-qwen2-vl (the trained testbed).",
    )
    device: str = Field("cpu", description="torch device, e.g. cpu or cuda:0.")
    torch_threads: int | None = Field(
        None, ge=1, le=1024, description="Intra-op CPU threads torch uses in this process "
        "(the model on a CPU, the query embedder). Unset: one less than the cores this "
        "process may run on, at least one, leaving a core to the event loop, the query "
        "embedder's and the engine's Python (measured: lab/load/NOTES.md).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto = float32 on CPU, bfloat16 on CUDA."
    )
    max_page_tokens: int | None = Field(
        None, ge=4, le=16384,
        description="Cap on visual tokens per page (bounds KV size); unset = the model's "
        "default (256 for real checkpoints, 512 for builtin:small-qwen2-vl, 16 for the "
        "builtin tiny models, 256 for the testbed).",
    )

    # storage
    home: Path = Field(Path(".conduit"), description="Directory for all on-disk state.")
    redis_url: str | None = Field(
        None, description="Redis URL; set it to run distributed (Redis KV, metadata, Celery)."
    )
    memory_kv_bytes: int = Field(
        512 * 2**20, ge=0, description="Byte budget of the in-memory page-KV LRU."
    )
    disk_kv_bytes: int = Field(
        20 * 2**30, ge=0, description="Byte budget of the on-disk page-KV tier."
    )
    redis_kv_ttl_s: int | None = Field(None, ge=1, description="TTL of page KV in Redis.")
    kv_int8: bool = Field(True, description="Store page KV quantised to int8.")

    # ingestion limits
    max_upload_bytes: int = Field(64 * 2**20, ge=1, description="Largest accepted upload.")
    max_pages: int = Field(500, ge=1, description="Most pages per document.")
    quota_bytes: int = _cap(
        20 * 2**30, "Per-tenant cap on the summed size of its uploads, every status counted "
        "until deleted; an upload past it gets 413 naming the limit.",
    )
    quota_documents: int = _cap(5000, "Per-tenant cap on its documents (413 past it).")
    quota_pages: int = _cap(
        100_000, "Per-tenant cap on the summed pages of its documents, each counted at upload "
        "(413 past it); bounds the page KV, images and index a tenant makes.",
    )
    disk_reserve_bytes: int = Field(
        1 * 2**30, ge=0, description="Free space kept on the home's filesystem: an upload that "
        "would leave less gets 507 (deletes, status and metadata writes still run). 0 = none.",
    )
    render_dpi: int = Field(100, ge=36, le=600, description="Render resolution.")
    max_page_pixels: int = Field(
        1654 * 2339, ge=10_000, description="Pixel cap per rendered page (A4 at 200 dpi)."
    )
    ingest_timeout_s: float = Field(600.0, gt=0, description="Per-document ingest deadline.")
    ocr: bool = Field(True, description="OCR pages without a usable text layer, and the "
                      "images of pages with figures (tesseract).")
    ocr_workers: int = Field(
        2, ge=1, le=64, description="Page reader processes that render and read (OCR) one "
        "document's pages in parallel.",
    )
    page_memory_mb: int = Field(
        2048, ge=256, description="Address-space cap (RLIMIT_AS) of each page reader process; "
        "a page that needs more fails its document with a message naming this limit.",
    )
    page_timeout_s: float = Field(
        300.0, gt=0, description="Hard time limit for reading one page (render, text, OCR); "
        "the reader is killed and the document failed with a message naming this limit.",
    )
    reader_memory_mb: int = Field(
        8192, ge=0, description="Memory all page readers of one process may use together: "
        "each reader reserves its page_memory_mb from it before it starts, so the readers' "
        "memory never exceeds it together. An upload whose check finds it spent is refused "
        "at once (503 with Retry-After, nothing stored); an accepted document waits for it "
        "up to its ingest deadline. A page_memory_mb above it runs one reader at a time. "
        "0 = unbounded.",
    )
    max_queued_documents_per_tenant: int | None = _tenant_cap(
        "Documents one tenant may have waiting for or in ingestion (counted in the metadata "
        "store); an upload beyond it is refused (429 with Retry-After, nothing stored).",
        keyed="16",
    )
    prefill_on_ingest: bool = Field(True, description="Prefill page KV during ingestion.")

    # answering
    policy: str = Field(DEFAULT_POLICY, description="Refresh policy of a question that names "
                        "none (one of `GET /v1/info`'s policies).")
    budget: float = Field(0.10, ge=0.0, le=1.0, description="Fraction of visual tokens refreshed.")
    head_cache: bool = Field(
        True, description="Compute the prompt head (chat template opening and answer "
        "instructions, identical for every question) once per model and reuse it exactly.")
    label_cache: bool = Field(
        True, description="Compute each page label once after the prompt head and reuse it "
        "stale like its page (recomputed with its whole page); off = labels are text rows, "
        "computed in both passes. Off whenever head_cache is off.")
    label_refresh: Literal["page", "always", "budget"] = Field(
        "always", description="With the label cache, the labels a refresh recomputes: "
        "'always' every stale one (the scoring pass reads them stale; the first, right after "
        "the head, is exact as cached), 'page' only those of the pages it refreshes whole "
        "(fewer rows computed; a model that reads the labels answers worse: measured, "
        "lab/testbed/NOTES.md), 'budget' the same labels as 'always' with their rows counted "
        "against the refresh budget (fewer visual tokens refreshed, the same share of rows).")
    label_cache_entries: int = Field(
        1024, ge=1, le=1_000_000, description="Page labels the label cache keeps per model "
        "process (least recently used dropped first). A label's K/V take layers x 2 x "
        "kv_heads x head_dim x dtype bytes a token: about 0.75 MB for a 13-token label on a "
        "7B model in bfloat16, so the default holds about 0.75 GB there.")
    never_above_full: bool = Field(
        True, description="Predict each answer's prefill FLOPs before it runs; where the "
        "policy would cost more than a full prefill from the cached page embeddings, run that "
        "instead (the answer says so: `fallback`). Off = always the policy's own path.")
    gamma: float | None = Field(
        None, ge=0.0, description="CONDUIT amplification exponent; unset = 1 (0 = off)."
    )
    score_layers: str | None = Field(
        None, pattern=r"^(all|-?\d+:-?\d+)$",
        description="Layers CONDUIT scores with: 'all' or 'start:stop'; unset = all.",
    )
    query_window: int | None = Field(
        None, ge=1, description="Score with the last w question tokens; unset = all of them "
        "(at most max_question_tokens).",
    )
    head_agg: Literal["mean", "max"] | None = Field(
        None, description="Aggregation over query heads; unset = mean."
    )
    bm25_weight: float = Field(1.0, ge=0.0, description="RRF weight of the BM25 ranking.")
    dense_weight: float = Field(
        0.6, ge=0.0, description="RRF weight of the dense ranking (the default, with rrf_k's, "
        "measured: docs/DECISIONS.md, 'RRF constant k = 10, dense weight 0.6').",
    )
    retrieval_index: bool = Field(
        True, description="Answer from the persistent per-collection retrieval index under "
        "<home>/index (Tantivy BM25 + memory-mapped passage vectors, updated as documents "
        "become ready or are deleted); off = rank by scanning every page of the scope.",
    )
    index_depth: int = Field(
        1000, ge=10, le=100_000, description="Pages each retriever (BM25, dense) hands to "
        "RRF from the index; deeper ranks add at most weight / (rrf_k + depth) to a page.",
    )
    index_ivf_min_rows: int = Field(
        32_768, ge=1, description="Passage vectors a collection needs before its index groups "
        "them into an inverted file (k-means lists) and a question scores only the lists "
        "nearest to it; below this every vector is scored exactly.",
    )
    index_scan_rows: int = Field(
        4_096, ge=256, le=10_000_000, description="Passage vectors a question scores exactly "
        "in a collection with an inverted file (the nearest lists, about this many rows; a "
        "scope with fewer rows is scored whole). More: closer to exact, slower.",
    )
    index_lock_timeout_s: float = Field(
        120.0, gt=0, description="How long an index writer waits for the collection's "
        "writer lock (one writer per collection across processes sharing the home dir).",
    )
    rrf_k: float = Field(  # = worker.retrieval.fusion.DEFAULT_RRF_K (tested)
        10.0, ge=0.0, description="RRF constant k: a page at rank r of a ranking scores "
        "weight / (k + r); smaller k trusts each ranking's top pages more.",
    )
    ref_weight: float = Field(
        0.0, ge=0.0, le=10.0, description="Weight of the page-reference term: a page the "
        "question names (\"page 5\", \"the last page\", \"Figure 2\") gains "
        "ref_weight * strength / (rrf_k + 1) (worker/retrieval/query_refs.py; scan path).",
    )
    clean_queries: bool = Field(
        True, description="Rank pages with the question less its answer-format instructions "
        "(\"Please write the answer in list format\", \"Round your answer to two decimal "
        "places\": worker/retrieval/query_clean.py); the model still reads the whole question.",
    )
    top_k: int = Field(3, ge=1, le=32, description="Pages retrieved per question.")
    max_new_tokens: int = Field(64, ge=1, le=4096, description="Default answer length cap.")

    max_active_answers: int = Field(
        16, ge=1, le=256, description="Answers one process's engine decodes together (one "
        "batched forward per token for all of them); further questions wait, admitted in turn "
        "across tenants, first come first served within one. 1 = one answer at a time (the "
        "serial engine). Each holds its own KV cache.",
    )
    max_answers_per_tenant: int | None = _tenant_cap(
        "Answers one tenant may have active or queued in one API process (queries, streams, "
        "chat completions); beyond it a question is refused (429 with Retry-After). Below "
        "max_active_answers it leaves answer slots to the other tenants, whose questions the "
        "engine admits in turn.",
        keyed="half of max_active_answers (at least 1)",
    )
    max_kv_tokens_in_flight: int = Field(
        65536, ge=1024, le=16_777_216, description="KV cache positions (prompt + answer) one "
        "process's active answers may hold together; a question waits until its cache fits, "
        "and one that alone needs more is refused (422). The decode pool, where the answers "
        "being generated sit side by side (one attention call a layer for all of them), holds "
        "at most as many positions again. 65536 positions are about 3.7 GB for "
        "a 7B Qwen2 model in bfloat16 (57 KB a position), 0.5 GB for the builtin default "
        "(float32, 8 KB a position).",
    )
    decode_compile: Literal["auto", "off", "on"] = Field(
        "auto", description="How one decode step of the pooled answers runs: auto = one CUDA "
        "graph per batch-size bucket (1, 2, 4, ... max_active_answers) on a GPU, eager on "
        "the CPU; on = the same on a GPU, torch.compile (inductor) on the CPU; off = eager "
        "everywhere. Other than eager, the decode pool is allocated once at its largest "
        "(max_kv_tokens_in_flight positions) when the model loads and kept, and an answer "
        "longer than one slot (max_kv_tokens_in_flight / max_active_answers) decodes eagerly "
        "from its own cache. The steps give the same tokens up to float rounding.",
    )
    worker_metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Distributed: a Celery worker process serves its "
        "engine's Prometheus series (batch size, queue length, time in queue) on this port.",
    )
    max_question_tokens: int = Field(
        1024, ge=1, le=32768, description="Longest accepted question in model tokens (422 "
        "above it).",
    )

    # reliability
    job_lease_s: float = Field(
        60.0, ge=1.0, description="A running ingest whose heartbeat (every lease/6) is older "
        "than this is presumed dead: the reaper requeues it and DELETE may remove its document.",
    )
    max_ingest_attempts: int = Field(
        3, ge=1, le=20, description="Deliveries of one ingest before its document is failed "
        "(a document that keeps killing workers stops being retried).",
    )
    reaper_interval_s: float = Field(
        10.0, gt=0, description="How often the API process looks for dead ingest jobs (and "
        "once at startup).",
    )
    answer_queue_wait_s: float = Field(
        60.0, gt=0, description="503 (with Retry-After) when a question waits this long "
        "for an answer slot in its process's engine; distributed, also when no worker starts "
        "it within this, and a worker silent this long mid-answer is presumed dead (resent "
        "once).",
    )
    answer_timeout_s: float = Field(
        600.0, gt=0, description="Distributed: 504 when an answer is not complete in this.",
    )

    # security
    api_keys: list[SecretStr] = Field(
        default_factory=list, description="Accepted bearer tokens; empty = no auth (loopback use)."
    )
    api_keys_file: Path | None = Field(
        None, description="JSON file of accepted keys: {key: tenant name} (rotate a key by "
        "mapping the new one to the same tenant) or a list of keys (tenant = a digest of the "
        "key). Adds to api_keys.",
    )
    metrics_key: SecretStr | None = Field(
        None, description="Bearer token that may read /metrics when API keys are configured "
        "(tenant keys cannot: the counters span every tenant).",
    )
    allow_open_network: bool = Field(
        False, description="Let `conduit serve` bind a non-loopback address with no API keys "
        "(warned at start). Without keys the service still answers only loopback Host names "
        "and allowed_hosts: use it for a container published on the host's loopback only, or "
        "behind a proxy that authenticates.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Host names (no port) answered besides localhost, "
        "*.localhost, 127.0.0.1 and [::1] when no API keys are configured; '*' answers any "
        "Host (no protection against DNS rebinding). With keys every Host is answered.",
    )

    # connections (`conduit serve`: service/connections.py; a reverse proxy adds its own)
    http_header_timeout_s: float = Field(
        15.0, gt=0, description="A connection must deliver a request's line and headers this "
        "soon after it opens or after its previous response; else it is closed.",
    )
    http_body_timeout_s: float = Field(
        60.0, gt=0, description="A request body must be complete this many seconds after its "
        "headers, plus a second for every http_body_min_rate bytes of it received (time the "
        "service itself stops reading is not counted); past it the request gets 408 (if "
        "nothing was answered yet) and the connection is closed.",
    )
    http_body_min_rate: int = Field(
        1024, ge=1, description="Bytes a second a request body must average, after its first "
        "http_body_timeout_s, to stay open.",
    )
    http_max_header_bytes: int = Field(
        65536, ge=1024, description="Largest request line plus headers; a request past it "
        "gets 431 and its connection is closed.",
    )
    http_keep_alive_s: float = Field(
        5.0, gt=0, description="How long an idle keep-alive connection stays open.",
    )
    http_max_connections: int = Field(
        1024, ge=8, le=1_000_000, description="Open client connections at most. A connection "
        "past it closes the oldest one still waiting for its request's headers, or itself "
        "when every one is in a request. The open-file limit is raised to fit it (lowered "
        "to fit the limit, with a warning, where it cannot be).",
    )

    @property
    def embedded(self) -> bool:
        """True when no Redis URL is set: API, worker and stores share one process."""
        return not self.redis_url

    @cached_property
    def torch_dtype(self) -> str:
        """The dtype name the model runs in."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.device.startswith("cuda") else "float32"

    @property
    def cpu_threads(self) -> int:
        """`torch_threads`, or its default: the usable cores less one, at least one."""
        if self.torch_threads is not None:
            return self.torch_threads
        return max(1, len(os.sched_getaffinity(0)) - 1)

    @property
    def model_cache_dir(self) -> Path:
        """Where builtin models are materialised."""
        return self.home / "models"
