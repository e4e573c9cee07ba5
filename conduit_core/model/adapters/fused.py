"""Fused projections: a decoder layer's q/k/v one weight, its gate/up another, in place.

A layer of the supported language models projects its normed input three times for
attention (q, k, v) and twice for the MLP (gate, up), each a matmul on the same input. Fused,
each group is one matmul whose output splits into the same tensors (views, no copy): two
matmuls per layer instead of five, in the scoring pass, the refresh and decode alike. Only
plain linear modules of one input size, dtype and device are fused; a layer already fused is
left as it is.

Fusing moves each group's weights (and biases) into one tensor, rows in module order,
and turns the modules' own parameters into views of it: the model's own forward reads the
same numbers from the same memory, so it stays the reference, and fusion costs no memory
(at its peak, one layer's group twice while it is moved). In-place updates of the parameters
(`load_state_dict`, an optimizer step) keep the sharing. What breaks it is giving a
parameter storage of its own (`model.to(...)`, `.half()`, assigning a new tensor): fuse the
model where it stays, after it is placed and cast (the loader does). A fused weight is no
parameter, so the fused path is taken only while no gradient is recorded (training reads the
modules' own). A checkpoint written from a fused model holds parameters that share one
buffer, which safetensors refuses: fuse models that serve, not models that train or export.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional

FUSED_ATTR = "conduit_fused"
QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


@dataclass(frozen=True)
class FusedLinear:
    """Several linear projections of one input as one matmul (module docstring)."""

    weight: torch.Tensor  # (O, I), O = sum(sizes): the modules' weights are its row blocks
    bias: torch.Tensor | None  # (O,)
    sizes: tuple[int, ...]  # output features of each module, in order

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each module's output of `x` (..., I): views (..., sizes[i]) of one matmul."""
        out = functional.linear(x, self.weight, self.bias)  # (..., O)
        return out.split(self.sizes, dim=-1)


def fused_of(module: Any) -> FusedLinear | None:
    """`module`'s fused group, where it has one and no gradient is being recorded."""
    fused: FusedLinear | None = getattr(module, FUSED_ATTR, None)
    return None if fused is None or torch.is_grad_enabled() else fused


@torch.no_grad()
def _fuse(owner: nn.Module, names: tuple[str, ...]) -> bool:
    """Fuse `owner`'s linear modules `names` in place; False where they do not qualify."""
    if getattr(owner, FUSED_ATTR, None) is not None:
        return False
    mods = [getattr(owner, name, None) for name in names]
    linears = [m for m in mods if type(m) is nn.Linear]
    if len(linears) != len(names):
        return False
    weights = [m.weight for m in linears]
    if len({(w.dtype, w.device, w.shape[1]) for w in weights}) != 1:
        return False
    biased = [m.bias is not None for m in linears]
    if any(biased) != all(biased):
        return False
    weight = torch.cat(weights)  # (O, I)
    bias = torch.cat([m.bias for m in linears if m.bias is not None]) if all(biased) else None
    sizes = tuple(int(w.shape[0]) for w in weights)
    at = 0
    for m, size in zip(linears, sizes, strict=True):
        m.weight = nn.Parameter(weight[at:at + size], requires_grad=m.weight.requires_grad)
        if bias is not None and m.bias is not None:
            m.bias = nn.Parameter(bias[at:at + size], requires_grad=m.bias.requires_grad)
        at += size
    setattr(owner, FUSED_ATTR, FusedLinear(weight, bias, sizes))
    return True


def fuse_layers(layers: Iterable[Any]) -> int:
    """Fuse each decoder layer's q/k/v and gate/up (module docstring); the groups fused."""
    fused = 0
    for layer in layers:
        fused += _fuse(layer.self_attn, QKV)
        fused += _fuse(layer.mlp, GATE_UP)
    return fused
