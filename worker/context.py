"""`WorkerContext`: the stores, files and (lazily loaded) model one pipeline process uses.

Built once per process from `Settings` by an entry point; the pipeline functions take it as their
first argument and read nothing from the environment.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from conduit_core import LoadedVLM, ReuseRuntime, load_vlm
from conduit_core.pass_warmup import WarmupSpec, warm_passes
from conduit_core.policies.choice import PolicyOptions
from storage.keys import RenderSettings
from storage.kv import build_kv_store
from storage.kv.tiered import TieredKVStore
from storage.metadata import MetadataStore, SQLiteMetadataStore
from worker.engine import AnswerEngine
from worker.policy_options import settle_policy
from worker.prompt import ANSWER_PREFIX, page_label
from worker.retrieval.embedder import Embedder
from worker.settings import Settings

log = logging.getLogger(__name__)
# seconds the model's load may spend capturing or compiling decode buckets, smallest first
# (a bucket started is finished; those left decode eagerly)
DECODE_PREPARE_BUDGET_S = 120.0


@dataclass
class WorkerContext:
    """Everything a pipeline step needs; the model loads on first use."""

    settings: Settings
    meta: MetadataStore
    kv: TieredKVStore
    home: Path
    embedder: Embedder
    _vlm: LoadedVLM | None = None
    _runtime: ReuseRuntime | None = None
    model_lock: threading.Lock = field(default_factory=threading.Lock)
    _load_lock: threading.Lock = field(default_factory=threading.Lock)
    _engine: AnswerEngine | None = None

    @property
    def render(self) -> RenderSettings:
        """Render settings that go into every page hash."""
        return RenderSettings(dpi=self.settings.worker.render_dpi,
                              max_pixels=self.settings.worker.max_page_pixels)

    @property
    def runtime(self) -> ReuseRuntime:
        """The reuse runtime over the configured model (loaded once, on first use, its decode
        step captured or compiled then: `CoreSettings.decode_compile`, the time logged; and
        its compiled passes warmed: `CoreSettings.compile_warmup_pages`)."""
        with self._load_lock:
            if self._runtime is None:
                s = self.settings
                log.info("loading model %s on %s (%s)", s.core.model, s.core.device,
                         s.core.torch_dtype)
                self._vlm = load_vlm(
                    s.core.model, device=s.core.device, dtype=s.core.torch_dtype,
                    cache_dir=s.model_cache_dir, max_image_tokens=s.core.max_page_tokens,
                )
                self._runtime = ReuseRuntime(self._vlm, head_cache=s.core.head_cache,
                                             label_cache=s.core.label_cache and s.core.head_cache,
                                             label_entries=s.core.label_cache_entries,
                                             label_refresh=s.core.label_refresh,
                                             never_above_full=s.core.never_above_full,
                                             decode_slots=s.worker.max_active_answers,
                                             decode_positions=s.worker.max_kv_tokens_in_flight,
                                             decode_compile=s.core.decode_compile,
                                             compile_passes=s.core.compile_passes,
                                             conversation_prefixes=s.core.conversation_prefixes,
                                             conversation_bytes=s.core.conversation_prefix_bytes,
                                             layer_group=s.core.prefill_layer_group,
                                             kv_workspace_bytes=s.core.kv_workspace_bytes)
                log.info("%s", self._runtime.prepare_decode(DECODE_PREPARE_BUDGET_S))
                self._warm_passes(self._runtime)
            return self._runtime

    def _warm_passes(self, runtime: ReuseRuntime) -> None:
        """Compile the passes' common shape buckets now, where they run compiled, with
        questions as the service asks them (`conduit_core.pass_warmup`); each line logged."""
        s = self.settings
        if not s.core.compile_warmup_pages:
            return
        spec = WarmupSpec(max_pages=s.core.compile_warmup_pages,
                          budget_s=s.core.compile_warmup_s, prefix=ANSWER_PREFIX,
                          policy=settle_policy(s, None, PolicyOptions()), budget=s.core.budget,
                          max_new_tokens=s.worker.max_new_tokens,
                          label=lambda number: page_label("document.pdf", number))
        for line in warm_passes(runtime, spec):
            log.info("%s", line)

    def preload_model(self) -> threading.Thread:
        """Load the model in a background thread now (a worker's startup), so that the first
        task, a question included, pays neither the load nor the hash of a local checkpoint's
        weights (`load_vlm`); a failure is logged here and raised again by the first task."""

        def load() -> None:
            try:
                _ = self.runtime
            except Exception:  # noqa: BLE001 - the first task reports it to its caller
                log.exception("model preload failed; the first task will try again")

        thread = threading.Thread(target=load, name="conduit-model-preload", daemon=True)
        thread.start()
        return thread

    @property
    def engine(self) -> AnswerEngine:
        """This process's answer engine (started on first use; the model loads on its first
        question or job): every answer and ingest prefill of the process runs through it."""
        with self._load_lock:
            if self._engine is None:
                s = self.settings
                self._engine = AnswerEngine(
                    lambda: self.runtime, max_active=s.worker.max_active_answers,
                    max_kv_tokens=s.worker.max_kv_tokens_in_flight,
                    queue_wait_s=s.worker.answer_queue_wait_s, model_lock=self.model_lock,
                    prefill_share=s.worker.prefill_share)
            return self._engine

    @property
    def model_loaded(self) -> bool:
        """Whether this process has loaded the model (an API process in the distributed form
        never does)."""
        return self._runtime is not None

    def page_image_path(self, relative: str) -> Path:
        """Absolute path of a stored page image."""
        return self.home / relative

    def close(self) -> None:
        """Stop the answer engine and release store connections."""
        if self._engine is not None:
            self._engine.close()
        self.meta.close()


def build_context(settings: Settings) -> WorkerContext:
    """Open the metadata and KV stores the settings describe (embedded or distributed),
    and set this process's torch CPU threads (`Settings.cpu_threads`)."""
    torch.set_num_threads(settings.worker.cpu_threads)
    home = settings.storage.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    meta: MetadataStore
    if settings.storage.redis_url:
        from storage.metadata import RedisMetadataStore

        meta = RedisMetadataStore(settings.storage.redis_url)
    else:
        meta = SQLiteMetadataStore(home / "metadata.sqlite3")
    kv = build_kv_store(
        home,
        memory_bytes=settings.storage.memory_kv_bytes,
        disk_bytes=settings.storage.disk_kv_bytes,
        redis_url=settings.storage.redis_url,
        redis_ttl_s=settings.storage.redis_kv_ttl_s,
        quantize=settings.storage.kv_int8,
    )
    return WorkerContext(settings=settings, meta=meta, kv=kv, home=home, embedder=Embedder())
