"""What a shared tier for conversation prefixes would cost: `conduit-lab bench prefix-transfer`.

Decides the distributed form of issue 66 (a Redis tier every worker reads, or routing a
conversation to the worker that holds its prefix). A kept prefix is the K and V of every
layer for every token of the conversation so far, so its size is the model's bytes per token
(2 x layers x KV heads x head dim x element size, from the config) times its tokens. For the
default builtin (its config as loaded, float32 on the CPU) and a 7B shape (Qwen2-VL-7B: 28
layers, 4 KV heads of 128, bfloat16), at `--tokens` tokens (default: the bench conversation's
turn 4, 1862), it times side by side in one process (one torch thread, a real `redis-server`
on loopback): a copy of the prefix in memory (what a hit pays) and a Redis round trip of it
as one safetensors value (`SET`, then `GET` and decode: what a follow-up on another worker
would pay before its own rows). Medians of `--repeats`. Writes JSON and markdown (default
lab/conversation/results/prefix_transfer.*).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import torch
from safetensors.torch import load, save

from conduit_core.model.loader import load_vlm
from lab.processes import start_redis

BUILTIN = "builtin:small-qwen2-vl"
SEVEN_B = {"layers": 28, "kv_heads": 4, "head_dim": 128, "dtype": "bfloat16"}


def _builtin_shape(cache_dir: Path) -> dict[str, Any]:
    vlm = load_vlm(BUILTIN, cache_dir=cache_dir)
    text = getattr(vlm.model.config, "text_config", vlm.model.config)
    heads = text.num_attention_heads
    return {"layers": text.num_hidden_layers, "kv_heads": text.num_key_value_heads,
            "head_dim": getattr(text, "head_dim", None) or text.hidden_size // heads,
            "dtype": str(vlm.dtype).removeprefix("torch.")}


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def _measure(client: redis.Redis, name: str, shape: dict[str, Any], tokens: int,
             repeats: int) -> dict[str, Any]:
    dtype = getattr(torch, shape["dtype"])
    kv = {f"{side}.{layer}": torch.randn(shape["kv_heads"], tokens, shape["head_dim"])
          .to(dtype)  # [kv_heads, tokens, head_dim]
          for layer in range(shape["layers"]) for side in ("k", "v")}
    per_token = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * dtype.itemsize
    key = f"prefix:{name}"

    def copy() -> dict[str, torch.Tensor]:
        return {k: t.clone() for k, t in kv.items()}

    def write() -> None:
        client.set(key, save(kv))

    def read() -> None:
        got = client.get(key)
        assert isinstance(got, bytes)
        load(got)

    copy_ms = _median_ms(copy, repeats)
    write_ms = _median_ms(write, repeats)
    read_ms = _median_ms(read, repeats)
    client.delete(key)
    return {"model": name, **shape, "tokens": tokens, "bytes_per_token": per_token,
            "prefix_mb": round(per_token * tokens / 2**20, 1), "copy_ms": copy_ms,
            "redis_write_ms": write_ms, "redis_read_ms": read_ms,
            "read_vs_copy": round(read_ms / max(copy_ms, 1e-3), 1)}


def run(tokens: int, repeats: int, command: str) -> dict[str, Any]:
    """The figures of both shapes (module docstring)."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        shapes = {BUILTIN: _builtin_shape(Path(tmp) / "models"), "7B shape": SEVEN_B}
        url, stop = start_redis(Path(tmp))
        try:
            client = redis.Redis.from_url(url)
            version = str(client.info("server").get("redis_version"))
            rows = [_measure(client, name, shape, tokens, repeats)
                    for name, shape in shapes.items()]
            client.close()
        finally:
            stop()
    return {"tokens": tokens, "repeats": repeats, "threads": 1, "redis_version": version,
            "command": command, "date": time.strftime("%Y-%m-%d"), "rows": rows}


def write(doc: dict[str, Any], out: Path) -> None:
    """JSON at `out`, a markdown table beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# A conversation prefix through Redis ({doc['date']})", "",
             f"Command: `{doc['command']}`", "",
             f"A prefix of {doc['tokens']} tokens, one torch thread, redis-server "
             f"{doc['redis_version']} on loopback, one safetensors value, medians of "
             f"{doc['repeats']}.", "",
             "| model | bytes/token | prefix MB | copy in memory ms | Redis SET ms | "
             "Redis GET + decode ms | GET / copy |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['model']} ({r['dtype']}) | {r['bytes_per_token']} | "
                     f"{r['prefix_mb']} | {r['copy_ms']} | {r['redis_write_ms']} | "
                     f"{r['redis_read_ms']} | {r['read_vs_copy']} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
