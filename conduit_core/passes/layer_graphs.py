"""The per-layer body of `forward_rows` compiled once per shape bucket (`torch.compile`,
fullgraph, dynamic=False), for the adapters it is switched on for (`compile_layers`).

A layer body is two pieces: `project` (input norm, q/k/v, rotary, the cache write) and
`finish` (attention under the bucket's mask, or the attention output a layer observer gave,
then o_proj and the MLP); without an observer they run as one graph (`body`). The loop over
layers stays in Python: the layers share the compiled code (their modules are graph inputs),
so a graph is compiled per bucket and piece, not per layer. A graph break raises
(fullgraph); the pieces and buckets run so far are `LayerGraphs.shapes`, dynamo's limit of
graphs a piece raised to `RECOMPILE_LIMIT` (process-wide). Modes: "off" (eager),
"on" (compiled on every device: "reduce-overhead", i.e. CUDA graphs, on CUDA), "auto" (on
for CUDA, off on the CPU, where eager is faster: docs/DECISIONS.md).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from conduit_core.model.adapters.base import VLMAdapter

PASS_COMPILE_MODES = ("auto", "off", "on")
# graphs one piece may hold (dynamo's default, 8, is below a few row buckets times key buckets)
RECOMPILE_LIMIT = 64


def _project(adapter: VLMAdapter, layer: Any, hidden: torch.Tensor, cos: torch.Tensor,
             sin: torch.Tensor, writes: torch.Tensor, keys: torch.Tensor,
             values: torch.Tensor) -> torch.Tensor:
    """Rotated queries (B, heads, R_b, hd) of `hidden` (B, R_b, d); writes the rows' K/V into
    `keys`/`values` (B, kv_heads, K_b, hd) at positions `writes` (R_b,)."""
    attn = layer.self_attn
    q, k, v = adapter.qkv(attn, layer.input_layernorm(hidden))  # (B, heads|kv_heads, R_b, hd)
    keys.index_copy_(2, writes, adapter.apply_rotary(k, cos, sin).to(keys.dtype))
    values.index_copy_(2, writes, v.to(values.dtype))
    return adapter.apply_rotary(q, cos, sin)


def _finish(adapter: VLMAdapter, layer: Any, attention: Callable[..., Any],
            hidden: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
            mask: torch.Tensor, attended: torch.Tensor | None) -> torch.Tensor:
    """The layer's output (B, R_b, d) from its input `hidden`, queries q (B, heads, R_b, hd)
    and the cache's keys/values (B, kv_heads, K_b, hd) under `mask` (1, 1, R_b, K_b);
    `attended` (B, R_b, heads, hd): the attention output, already computed."""
    attn = layer.self_attn
    b, r, _ = hidden.shape
    if attended is None:
        attended, _ = attention(attn, q, keys, values, mask, dropout=0.0,
                                scaling=attn.scaling, is_causal=False)  # (B, R_b, heads, hd)
    hidden = hidden + attn.o_proj(attended.reshape(b, r, -1))
    return hidden + adapter.mlp(layer.mlp, layer.post_attention_layernorm(hidden))


def _body(adapter: VLMAdapter, layer: Any, attention: Callable[..., Any], hidden: torch.Tensor,
          cos: torch.Tensor, sin: torch.Tensor, writes: torch.Tensor, keys: torch.Tensor,
          values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`_project` then `_finish`, one layer without an observer: (B, R_b, d)."""
    q = _project(adapter, layer, hidden, cos, sin, writes, keys, values)
    return _finish(adapter, layer, attention, hidden, q, keys, values, mask, None)


class LayerGraphs:
    """The compiled layer pieces of one adapter (module docstring)."""

    def __init__(self, device: torch.device, backend: str = "inductor"):
        cuda = device.type == "cuda"
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
        mode = "reduce-overhead" if cuda and backend == "inductor" else None

        def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
            return torch.compile(fn, fullgraph=True, dynamic=False, backend=backend, mode=mode)

        self.project = compiled(_project)
        self.finish = compiled(_finish)
        self.body = compiled(_body)
        self.backend = backend
        self.runs = 0  # layer pieces run compiled
        self.shapes: set[tuple[str, int, int]] = set()  # (piece, R_b, K_b) run so far

    def seen(self, piece: str, rows: int, keys: int) -> None:
        """Record one layer piece run at bucket (rows, keys)."""
        self.runs += 1
        self.shapes.add((piece, rows, keys))


_GRAPHS: weakref.WeakKeyDictionary[VLMAdapter, LayerGraphs] = weakref.WeakKeyDictionary()
# every adapter's graphs by backend, kept while it is switched off: switched on again, it
# finds its compiled buckets (a new `torch.compile` of the same code would compile again)
_BUILT: weakref.WeakKeyDictionary[VLMAdapter, dict[str, LayerGraphs]] = \
    weakref.WeakKeyDictionary()


def pass_kind(mode: str, device: torch.device | str) -> str:
    """"compile" or "eager": how the passes' layers run for `mode` on `device`."""
    if mode not in PASS_COMPILE_MODES:
        raise ValueError(f"pass compile mode must be one of {PASS_COMPILE_MODES}, got {mode!r}")
    cuda = torch.device(device).type == "cuda"
    return "compile" if mode == "on" or (mode == "auto" and cuda) else "eager"


def compile_layers(adapter: VLMAdapter, mode: str, backend: str = "inductor") -> None:
    """Run `adapter`'s passes with compiled layer bodies where `pass_kind(mode)` says so,
    else eagerly."""
    if pass_kind(mode, adapter.device) == "compile":
        built = _BUILT.setdefault(adapter, {})
        if backend not in built:
            built[backend] = LayerGraphs(torch.device(adapter.device), backend)
        _GRAPHS[adapter] = built[backend]
    else:
        _GRAPHS.pop(adapter, None)


def layer_graphs(adapter: VLMAdapter) -> LayerGraphs | None:
    """The compiled layer pieces of `adapter`, None where its passes run eagerly."""
    return _GRAPHS.get(adapter)
