"""`WorkerContext`: the stores, files and (lazily loaded) model one pipeline process uses.

Built once per process from `Settings` by an entry point; the pipeline functions take it as their
first argument and read nothing from the environment.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from conduit_core import LoadedVLM, ReuseRuntime, load_vlm
from storage.keys import RenderSettings
from storage.kv import build_kv_store
from storage.kv.tiered import TieredKVStore
from storage.metadata import MetadataStore, SQLiteMetadataStore
from worker.retrieval.embedder import Embedder
from worker.settings import Settings

log = logging.getLogger(__name__)


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

    @property
    def render(self) -> RenderSettings:
        """Render settings that go into every page hash."""
        return RenderSettings(dpi=self.settings.render_dpi,
                              max_pixels=self.settings.max_page_pixels)

    @property
    def runtime(self) -> ReuseRuntime:
        """The reuse runtime over the configured model (loaded once, on first use)."""
        with self._load_lock:
            if self._runtime is None:
                s = self.settings
                log.info("loading model %s on %s (%s)", s.model, s.device, s.torch_dtype)
                self._vlm = load_vlm(
                    s.model, device=s.device, dtype=s.torch_dtype,
                    cache_dir=s.model_cache_dir, max_image_tokens=s.max_page_tokens,
                )
                self._runtime = ReuseRuntime(self._vlm, head_cache=s.head_cache,
                                             never_above_full=s.never_above_full)
            return self._runtime

    @property
    def model_loaded(self) -> bool:
        """Whether this process has loaded the model (an API process in the distributed form
        never does)."""
        return self._runtime is not None

    def page_image_path(self, relative: str) -> Path:
        """Absolute path of a stored page image."""
        return self.home / relative

    def close(self) -> None:
        """Release store connections."""
        self.meta.close()


def build_context(settings: Settings) -> WorkerContext:
    """Open the metadata and KV stores the settings describe (embedded or distributed)."""
    home = settings.home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    meta: MetadataStore
    if settings.redis_url:
        from storage.metadata import RedisMetadataStore

        meta = RedisMetadataStore(settings.redis_url)
    else:
        meta = SQLiteMetadataStore(home / "metadata.sqlite3")
    kv = build_kv_store(
        home,
        memory_bytes=settings.memory_kv_bytes,
        disk_bytes=settings.disk_kv_bytes,
        redis_url=settings.redis_url,
        redis_ttl_s=settings.redis_kv_ttl_s,
        quantize=settings.kv_int8,
    )
    return WorkerContext(settings=settings, meta=meta, kv=kv, home=home, embedder=Embedder())
