"""What one page's prefill leaves behind, and the fingerprint that guards its reuse.

`PageKV` is the seam between the runtime (which produces and consumes it) and the storage
layer (which serialises it with safetensors). It holds only tensors and plain metadata.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

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


@dataclass
class PageKV:
    """One page segment's cached state from its canonical prefill.

    Shapes (T = tokens in the page segment, L = decoder layers):
      embeds:        (T, hidden)                      layer-0 input embeddings
      keys, values:  (L, kv_heads, T, head_dim)       keys after RoPE at `position_ids`
      position_ids:  (P, T) int64, P = 3 for M-RoPE models, 1 otherwise
      token_ids:     (T,) int64
      image_grid:    (3,) int64, (t, h, w) patch grid of the page image (model family specific)
    """

    embeds: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    position_ids: torch.Tensor
    token_ids: torch.Tensor
    image_grid: torch.Tensor
    fingerprint: ModelFingerprint

    @property
    def num_tokens(self) -> int:
        """Tokens in the page segment."""
        return int(self.token_ids.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held by the tensors."""
        tensors = (self.embeds, self.keys, self.values, self.position_ids, self.token_ids,
                   self.image_grid)
        return sum(t.numel() * t.element_size() for t in tensors)

    def check_fingerprint(self, expected: ModelFingerprint) -> None:
        """Raise `FingerprintMismatch` unless this page was prefilled by `expected`."""
        if self.fingerprint != expected:
            raise FingerprintMismatch(
                f"cached page was prefilled by {self.fingerprint} but the runtime is {expected}; "
                "it cannot be reused"
            )
