"""The device and dtype the model-level tests run on, and the tolerances that go with them.

`CONDUIT_TEST_DEVICE` (default "cpu") and `CONDUIT_TEST_DTYPE` (default "float32") choose
where and in what precision the core and policy parity tests load their models, so that the
same suite runs on a GPU in one command:
    CONDUIT_TEST_DEVICE=cuda CONDUIT_TEST_DTYPE=bfloat16 pytest tests/core tests/policies
Tests that compare two computations take their tolerance from `tol(kind)`: float32 keeps the
bounds the suite always had; bfloat16 (8 significant bits, 2^-8 relative rounding per
operation) and float16 widen them by what a few layers of rounding can add. Tests that
check exact equality of two paths that run the same operations stay exact in every dtype.

Public API:
  TEST_DEVICE: str;  TEST_DTYPE: str;  TORCH_DTYPE: torch.dtype;  LOW_PRECISION: bool
  tol(kind) -> dict(rtol=..., atol=...)   kinds: "logits", "hidden", "keys", "scores"
  to_device(x) -> x moved to TEST_DEVICE (tensors, or dicts of them)
"""

from __future__ import annotations

import os
from typing import Any

import torch

TEST_DEVICE = os.environ.get("CONDUIT_TEST_DEVICE", "cpu")
TEST_DTYPE = os.environ.get("CONDUIT_TEST_DTYPE", "float32")
TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16,
               "float16": torch.float16}[TEST_DTYPE]
LOW_PRECISION = TORCH_DTYPE != torch.float32
if TEST_DEVICE.startswith("cuda") and not LOW_PRECISION:
    # float32 means float32 here: cuDNN runs convolutions (the vision towers' patch
    # embeddings) in TF32 by default, which alone moved a batched page prefill 2e-3 from a
    # single one on an H200 (lab/gpu/results/h200-20261204)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

# (rtol, atol) per kind and dtype. float32: the suite's historical bounds (two float32 paths
# summing in another order). bfloat16: logits of the tiny random models are O(1) and pass
# through 2-4 layers, each rounding its outputs to 8 bits: a few percent of a logit.
_TOLERANCES: dict[str, dict[str, tuple[float, float]]] = {
    "float32": {"logits": (1e-4, 1e-4), "hidden": (1e-4, 1e-4), "keys": (1e-5, 1e-5),
                "scores": (1e-4, 1e-6)},
    "bfloat16": {"logits": (5e-2, 5e-2), "hidden": (5e-2, 5e-2), "keys": (2e-2, 5e-2),
                 "scores": (5e-2, 1e-3)},
    "float16": {"logits": (1e-2, 1e-2), "hidden": (1e-2, 1e-2), "keys": (5e-3, 1e-2),
                "scores": (1e-2, 1e-4)},
}


def tol(kind: str) -> dict[str, float]:
    """`torch.testing.assert_close` keyword arguments for comparisons of `kind`."""
    rtol, atol = _TOLERANCES[TEST_DTYPE][kind]
    return {"rtol": rtol, "atol": atol}


def to_device(x: Any) -> Any:
    """`x` (a tensor, or a dict/list of them, other values untouched) on TEST_DEVICE."""
    if isinstance(x, torch.Tensor):
        return x.to(TEST_DEVICE)
    if isinstance(x, dict):
        return {k: to_device(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(v) for v in x)
    return x


def atol(kind: str) -> float:
    """The absolute tolerance of `kind` (for max-abs-error checks)."""
    return tol(kind)["atol"]


def same_answer(a: list[int], b: list[int]) -> bool:
    """Whether two greedy answers of paths that differ only by rounding agree: token for
    token in float32; in a lower precision, on the first token (later tokens may part after
    a near-tie, each path rounding its sums differently, and then diverge for good)."""
    return a == b if not LOW_PRECISION else a[:1] == b[:1]
