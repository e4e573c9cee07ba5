"""The settings of the worker's pipeline: reading uploads, retrieval, the answer engine, and how
dead jobs are found and retried."""

from __future__ import annotations

import os

from pydantic import Field
from pydantic_settings import BaseSettings

from worker.settings.fields import FLAT_ENV, cap, tenant_cap


class WorkerSettings(BaseSettings):
    """Ingestion, retrieval, answering and recovery."""

    model_config = FLAT_ENV

    # this process
    torch_threads: int | None = Field(
        None, ge=1, le=1024, description="Intra-op CPU threads torch uses in this process "
        "(the model on a CPU, the query embedder). Unset: one less than the cores this "
        "process may run on, at least one, leaving a core to the event loop, the query "
        "embedder's and the engine's Python (measured: lab/load/NOTES.md).",
    )

    # ingestion
    max_upload_bytes: int = Field(64 * 2**20, ge=1, description="Largest accepted upload.")
    max_pages: int = Field(500, ge=1, description="Most pages per document.")
    render_dpi: int = Field(100, ge=36, le=600, description="Render resolution.")
    max_page_pixels: int = Field(
        1654 * 2339, ge=10_000, description="Pixel cap per rendered page (A4 at 200 dpi)."
    )
    ingest_timeout_s: float = Field(600.0, gt=0, description="Per-document ingest deadline.")
    office_conversion: bool = Field(
        True, description="Convert Office and OpenDocument uploads to PDF with LibreOffice "
        "headless (when installed); off, or without LibreOffice, they get 415 saying so.")
    office_timeout_s: float = Field(
        120.0, gt=0, description="Wall-clock and CPU-time limit of one LibreOffice "
        "conversion; past it the upload is refused (422).")
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
    max_queued_documents_per_tenant: int | None = tenant_cap(
        "Documents one tenant may have waiting for or in ingestion (counted in the metadata "
        "store); an upload beyond it is refused (429 with Retry-After, nothing stored).",
        keyed="16",
    )
    prefill_on_ingest: bool = Field(True, description="Prefill page KV during ingestion.")

    # retrieval
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

    # answering: the engine
    max_new_tokens: int = Field(64, ge=1, le=4096, description="Default answer length cap.")
    max_active_answers: int = Field(
        16, ge=1, le=256, description="Answers one process's engine decodes together (one "
        "batched forward per token for all of them); further questions wait, admitted in turn "
        "across tenants, first come first served within one. 1 = one answer at a time (the "
        "serial engine). Each holds its own KV cache.",
    )
    max_answers_per_tenant: int | None = tenant_cap(
        "Answers one tenant may have active or queued in one API process (queries, streams, "
        "chat completions); beyond it a question is refused (429 with Retry-After). Below "
        "max_active_answers it leaves answer slots to the other tenants, whose questions the "
        "engine admits in turn.",
        keyed="half of max_active_answers (at least 1)",
    )
    prefill_share: float = Field(
        0.5, ge=0.0, le=100.0, description="A new question's prefill time one engine step "
        "runs before the running answers' decode step, over that decode step's time (the "
        "median of the last few): a running answer waits about 1 + prefill_share decode steps "
        "between two tokens while questions arrive. Larger: newcomers reach their first "
        "token sooner, streams stutter more; 0 = one prefill phase a step.",
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
    worker_metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Distributed: a Celery worker process serves its "
        "engine's Prometheus series (batch size, queue length, time in queue) on this port.",
    )
    max_question_tokens: int = Field(
        1024, ge=1, le=32768, description="Longest accepted question in model tokens (422 "
        "above it).",
    )

    # conversations: follow-ups that read their earlier turns
    conversation_max_turns: int = Field(
        16, ge=1, le=256, description="Answered turns a follow-up reads; older ones are "
        "dropped (the answer says how many) and the conversation is reassembled without them.")
    conversation_max_tokens: int = Field(
        16384, ge=256, le=1_048_576, description="Tokens (pages, questions, answers) a "
        "follow-up's conversation may hold, at most the model's context; past it the oldest "
        "turns are dropped as past conversation_max_turns.")
    conversation_recency: float = Field(
        0.5, gt=0.0, le=1.0, description="A follow-up's pages are ranked by its question and "
        "its earlier user turns together, each turn's fused retrieval score weighted by this "
        "to the power of how many turns back it is (1 = all turns alike).")
    conversation_max_stored: int = cap(
        1000, "Conversations one tenant may keep (POST /v1/conversations past it: 413).")
    conversation_turn_limit: int = cap(
        200, "Turns one stored conversation may hold; a message past it gets 409 (start a "
        "new conversation).")
    conversation_ttl_s: float = Field(
        7 * 24 * 3600.0, gt=0, description="A conversation untouched this long expires (404, "
        "as a deleted one).")

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

    @property
    def cpu_threads(self) -> int:
        """`torch_threads`, or its default: the usable cores less one, at least one."""
        if self.torch_threads is not None:
            return self.torch_threads
        return max(1, len(os.sched_getaffinity(0)) - 1)
