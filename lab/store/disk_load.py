"""The load of one question's pages from the disk tier at 7B sizes: sequential against
parallel, bf16 against int8 entries, against the raw file reads under it.

Synthetic pages of a 7B Qwen2.5-VL page's shapes (28 layers x 2 x 4 KV heads x 128 dims x 256
tokens: 14.7 MB of bf16 keys and values, plus the layer-0 embeddings, 256 x 3584) are written
to a disk tier once per form (bf16 as computed; int8 as `CONDUIT_KV_INT8` stores them).
Each repeat reads the question's `pages` entries through `DiskKVStore.get_many` with 1, 2,
4 and 8 read threads, and the same files by the plain path under the tier (one `readinto` of
each whole file into an uninitialised buffer, one thread and `threads` threads), in an order
that alternates between repeats. Two cache states: `warm` (the files in the page cache, as
a question right after another on the same pages) and `cold` (each file dropped from the
page cache with `posix_fadvise(DONTNEED)` before the read, so it comes from the device).
Figures are the best of `repeats`; MB/s counts the entry bytes.

    conduit-lab bench disk-load      # lab/store/results/disk_load.{json,md}

Public API:
  PAGE_7B = (tokens, layers, kv_heads, head_dim, hidden)
  run_disk_load(pages, repeats, threads, work, out, command) -> dict
  to_markdown(result) -> str
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from conduit_core.page_kv import ModelFingerprint, PageKV
from storage.keys import PageHash
from storage.kv.disk import DiskKVStore

PAGE_7B = (256, 28, 4, 128, 3584)
TIER_THREADS = (1, 2, 4, 8)


def _pages(n: int) -> dict[PageHash, PageKV]:
    """`n` random bf16 pages of `PAGE_7B`'s shapes."""
    tokens, layers, heads, dim, hidden = PAGE_7B
    fp = ModelFingerprint(name="bench-7b", revision="0", dtype="bfloat16",
                          config_hash="0" * 64, template_version="bench")
    g = torch.Generator().manual_seed(0)
    out: dict[PageHash, PageKV] = {}
    for i in range(n):
        out[PageHash(f"{i:04x}" + "7b" * 30)] = PageKV(
            embeds=torch.randn(tokens, hidden, generator=g).to(torch.bfloat16),
            keys=torch.randn(layers, heads, tokens, dim, generator=g).to(torch.bfloat16),
            values=torch.randn(layers, heads, tokens, dim, generator=g).to(torch.bfloat16),
            position_ids=torch.arange(tokens).expand(3, tokens).clone(),
            token_ids=torch.arange(tokens), image_grid=torch.tensor([1, 16, 16]),
            fingerprint=fp)
    return out


def _drop_from_page_cache(paths: list[Path]) -> None:
    """Evict the files' pages from the page cache (only these files)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _raw_read(path: Path) -> np.ndarray:
    with open(path, "rb", buffering=0) as f:
        buf = np.empty(os.fstat(f.fileno()).st_size, dtype=np.uint8)
        f.readinto(buf.data)
    return buf


def _raw_reads(paths: list[Path], pool: ThreadPoolExecutor | None) -> list[np.ndarray]:
    """`_raw_read` of every path, one after another or on `pool`."""
    return list(pool.map(_raw_read, paths)) if pool else [_raw_read(p) for p in paths]


def run_disk_load(*, pages: int = 8, repeats: int = 5, threads: int = 4,
                  work: Path | None = None, out: Path | None = None,
                  command: str = "") -> dict[str, Any]:
    """Measure the cases of the module docstring; write JSON to `out` and markdown beside."""
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    batch = _pages(pages)
    keys = list(batch)
    root = Path(tempfile.mkdtemp(prefix="conduit-disk-load-", dir=work))
    pool = ThreadPoolExecutor(threads)
    best: dict[tuple[str, str, str], float] = {}
    sizes: dict[str, int] = {}
    try:
        for form in ("bf16", "int8"):
            writer = DiskKVStore(root / form, 1 << 40, quantize=form == "int8", fsync=False)
            writer.put_many(batch)
            paths = [writer.path(k) for k in keys]
            sizes[form] = sum(p.stat().st_size for p in paths) // pages
            os.sync()
            stores = {n: DiskKVStore(root / form, 1 << 40, read_threads=n)
                      for n in TIER_THREADS}
            cases: list[tuple[str, Callable[[], object]]] = [
                ("raw, 1 thread", partial(_raw_reads, paths, None)),
                (f"raw, {threads} threads", partial(_raw_reads, paths, pool)),
                *[(f"tier, {n} read threads", partial(s.get_many, keys))
                  for n, s in stores.items()]]
            for r in range(repeats):
                for cache in ("warm", "cold"):
                    for name, fn in cases if r % 2 == 0 else cases[::-1]:
                        if cache == "cold":
                            _drop_from_page_cache(paths)
                        else:
                            fn()  # the files in the page cache
                        t0 = time.perf_counter()
                        got = fn()
                        dt = time.perf_counter() - t0
                        del got
                        key = (form, cache, name)
                        best[key] = min(dt, best.get(key, float("inf")))
    finally:
        pool.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for (form, cache, name), dt in sorted(best.items()):
        raw = best[(form, cache, "raw, 1 thread")]
        rows.append({"form": form, "cache": cache, "case": name, "ms": round(dt * 1e3, 2),
                     "mb_per_s": round(sizes[form] * pages / dt / 1e6, 1),
                     "vs_raw_1_thread": round(raw / dt, 3)})
    tokens, layers, heads, dim, hidden = PAGE_7B
    result: dict[str, Any] = {
        "config": {"command": command, "pages": pages, "repeats": repeats,
                   "statistic": "best of repeats", "raw_threads": threads,
                   "page": {"tokens": tokens, "layers": layers, "kv_heads": heads,
                            "head_dim": dim, "hidden": hidden},
                   "kv_bytes_per_page_bf16": 2 * layers * heads * tokens * dim * 2,
                   "entry_bytes_per_page": sizes, "cpus": os.cpu_count(),
                   "load_avg_1m_at_start": round(load, 2), "torch_threads": 1},
        "rows": rows}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        out.with_suffix(".md").write_text(to_markdown(result))
    return result


def to_markdown(result: dict[str, Any]) -> str:
    """The result as a markdown table with its command and page sizes."""
    cfg = result["config"]
    sizes = cfg["entry_bytes_per_page"]
    lines = [f"# Loading {cfg['pages']} pages of a 7B model from the disk tier", "",
             "    " + cfg["command"], "",
             f"Bytes per page (entry on disk): bf16 {sizes['bf16']:,}, int8 {sizes['int8']:,} "
             f"(keys and values alone in bf16: {cfg['kv_bytes_per_page_bf16']:,}). Best of "
             f"{cfg['repeats']}; {cfg['cpus']} CPUs, load {cfg['load_avg_1m_at_start']} at "
             "the start.", "",
             "| form | page cache | case | ms | MB/s | speed vs raw, 1 thread |",
             "|---|---|---|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['form']} | {r['cache']} | {r['case']} | {r['ms']:.1f} | "
                     f"{r['mb_per_s']:.0f} | {r['vs_raw_1_thread']:.2f} |")
    return "\n".join(lines) + "\n"
