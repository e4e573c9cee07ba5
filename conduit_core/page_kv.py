"""What one page's prefill leaves behind, and the fingerprint that guards its reuse.

`PageKV` is the seam between the runtime (which produces and consumes it) and the storage
layer (which serialises it with safetensors). It holds only tensors and plain metadata, on
the host (`PageKV.to_host`: the runtime returns host pages, the memory tier keeps them so,
page-locked where CUDA is available). A page is reused only under the fingerprint it was
made with (`check_fingerprint`).

A page comes in one of two forms. Float: `keys`/`values` as computed. Int8 (from an int8
tier): `keys`/`values` are symmetric int8 with float32 scales, keys per channel, values per
token; `kv_dtype` is the dtype they dequantise to (`dequantize_int8`:
`(q.float() * scale).to(kv_dtype)`). The runtime copies int8 pages as they are (half the bytes
of bf16) and dequantises on the device.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

import torch

from conduit_core.errors import FingerprintMismatch


@dataclass(frozen=True)
class ModelFingerprint:
    """Identity of everything that shapes cached tensors: a mismatch means no reuse."""

    name: str  # model name or path as configured
    revision: str  # hub revision, or a digest of the weights for local/builtin models
    dtype: str  # e.g. "float32", "bfloat16"
    config_hash: str  # sha256 of the model config JSON
    template_version: str  # version of the canonical page-context template

    def digest(self) -> str:
        """A stable sha256 hex digest of all fields."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def to_json(self) -> str:
        """Serialise to a JSON string (used in safetensors headers)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelFingerprint:
        """Inverse of `to_json`."""
        return cls(**json.loads(text))


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Symmetric int8 `q` times its float32 `scale` (broadcast), cast to `dtype`; the one
    formula every tier and the runtime use (on whatever device `q` is)."""
    return (q.float() * scale).to(dtype)


def pin_host_memory() -> bool:
    """Whether host copies of page KV are pinned (page-locked) here: when CUDA is available,
    so that host-to-device copies can run asynchronously."""
    return torch.cuda.is_available()


def _host(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """`t` on the host (pinned if `pin`); the same tensor when it already is."""
    if t.device.type == "cpu" and (not pin or t.is_pinned()):
        return t
    if pin:
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return out.copy_(t)
    return t.cpu()


@dataclass
class PageKV:
    """One page segment's cached state from its canonical prefill.

    Shapes (T = tokens in the page segment, L = decoder layers):
      embeds:        (T, hidden)                      layer-0 input embeddings
      keys, values:  (L, kv_heads, T, head_dim)       keys after RoPE at `position_ids`
                                                      (int8 in the int8 form)
      position_ids:  (P, T) int64, P = 3 for M-RoPE models, 1 otherwise
      token_ids:     (T,) int64
      image_grid:    (3,) int64, (t, h, w) patch grid of the page image (model family specific)
      key_scale:     (L, kv_heads, 1, head_dim) float32, int8 form only
      value_scale:   (L, kv_heads, T, 1) float32, int8 form only
      kv_dtype:      the dtype int8 keys/values dequantise to (int8 form only)
    """

    embeds: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    position_ids: torch.Tensor
    token_ids: torch.Tensor
    image_grid: torch.Tensor
    fingerprint: ModelFingerprint
    key_scale: torch.Tensor | None = None
    value_scale: torch.Tensor | None = None
    kv_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        parts = (self.key_scale is None, self.value_scale is None, self.kv_dtype is None)
        if len(set(parts)) != 1 or (self.quantized and (self.keys.dtype != torch.int8
                                                        or self.values.dtype != torch.int8)):
            raise ValueError("an int8 page needs int8 keys and values, both scales and kv_dtype")

    @property
    def quantized(self) -> bool:
        """Whether keys and values are in the int8 form."""
        return self.key_scale is not None

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the keys and values as computed (after dequantisation)."""
        return self.kv_dtype if self.kv_dtype is not None else self.keys.dtype

    @property
    def num_tokens(self) -> int:
        """Tokens in the page segment."""
        return int(self.token_ids.shape[0])

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor the page holds (scales included in the int8 form)."""
        out: tuple[torch.Tensor, ...] = (self.embeds, self.keys, self.values,
                                         self.position_ids, self.token_ids, self.image_grid)
        if self.key_scale is not None and self.value_scale is not None:
            out += (self.key_scale, self.value_scale)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes held by the tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def dequantized(self) -> PageKV:
        """The float form (itself when it is one): keys and values dequantised where they
        are (`dequantize_int8`)."""
        if self.key_scale is None or self.value_scale is None or self.kv_dtype is None:
            return self
        return replace(self, keys=dequantize_int8(self.keys, self.key_scale, self.kv_dtype),
                       values=dequantize_int8(self.values, self.value_scale, self.kv_dtype),
                       key_scale=None, value_scale=None, kv_dtype=None)

    def to_host(self, pin: bool | None = None) -> PageKV:
        """The page with every tensor on the host, page-locked when `pin` (default:
        `pin_host_memory()`); itself when nothing has to move."""
        pin = pin_host_memory() if pin is None else pin
        moved = {name: _host(getattr(self, name), pin) for name in _TENSOR_FIELDS
                 if getattr(self, name) is not None}
        if all(moved[n] is getattr(self, n) for n in moved):
            return self
        return replace(self, **moved)  # type: ignore[arg-type]

    def check_fingerprint(self, expected: ModelFingerprint) -> None:
        """Raise `FingerprintMismatch` unless this page was prefilled by `expected`."""
        if self.fingerprint != expected:
            raise FingerprintMismatch(
                f"cached page was prefilled by {self.fingerprint} but the runtime is {expected}; "
                "it cannot be reused"
            )


_TENSOR_FIELDS = ("embeds", "keys", "values", "position_ids", "token_ids", "image_grid",
                  "key_scale", "value_scale")
