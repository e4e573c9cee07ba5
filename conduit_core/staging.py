"""Staging of the page KV one question loads: one host buffer, one copy to the device.

Cached pages live on the host (`PageKV.to_host`). Copying them to an accelerator tensor by
tensor, from pageable memory, makes every copy a blocking one and costs a launch per tensor.
Here the tensors a question needs (all pages' keys, values, embeddings and int8 scales) are
concatenated once into one host buffer, page-locked where CUDA is available, and that buffer
goes to the device in one `non_blocking` copy; the tensors come back as views of the device
buffer, in the order asked for. The copy is ordered before any kernel that reads it on the
same stream, and the caching host allocator keeps the pinned buffer alive until the copy has
run, so nothing waits on the host.

On the CPU nothing is copied twice: the concatenation is the only copy (it is what the
batched re-rotation reads), and the "device copy" is the buffer itself.

Public API:
  ALIGN = 64                            byte alignment of each tensor in the buffer
  stage(groups, device, pin=None) -> list[Tensor]
      groups: sequences of tensors concatenated along dim `dim` each, as (tensors, dim);
      returns one tensor per group on `device`, views of a single device buffer; `pin`
      defaults to `pin_host_memory()` and only applies when `device` is not the CPU
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from conduit_core.page_kv import pin_host_memory

ALIGN = 64


def _cat_shape(tensors: Sequence[torch.Tensor], dim: int) -> list[int]:
    shape = list(tensors[0].shape)
    shape[dim] = sum(int(t.shape[dim]) for t in tensors)
    return shape


def stage(groups: Sequence[tuple[Sequence[torch.Tensor], int]], device: torch.device,
          pin: bool | None = None) -> list[torch.Tensor]:
    """Concatenate each group of host (or any) tensors into one host buffer and copy it to
    `device` once (see the module docstring). Every tensor of a group shares a dtype."""
    device = torch.device(device)
    on_cpu = device.type == "cpu"
    pin = (pin_host_memory() if pin is None else pin) and not on_cpu
    layout: list[tuple[int, torch.dtype, list[int]]] = []  # (byte offset, dtype, shape)
    total = 0
    for tensors, dim in groups:
        dtype = tensors[0].dtype
        shape = _cat_shape(tensors, dim)
        nbytes = torch.Size(shape).numel() * tensors[0].element_size()
        layout.append((total, dtype, shape))
        total += -(-nbytes // ALIGN) * ALIGN
    host = torch.empty(total, dtype=torch.uint8, pin_memory=pin)  # (bytes,)
    for (tensors, dim), (offset, dtype, shape) in zip(groups, layout, strict=True):
        torch.cat([t.to("cpu", dtype) for t in tensors], dim=dim,
                  out=_view(host, offset, dtype, shape))  # host parts: no copy but this one
    buf = host if on_cpu else host.to(device, non_blocking=pin)  # one copy for the question
    return [_view(buf, offset, dtype, shape) for offset, dtype, shape in layout]


def _view(buf: torch.Tensor, offset: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """The tensor of `dtype` and `shape` at byte `offset` of a uint8 buffer."""
    nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    return buf[offset:offset + nbytes].view(dtype).view(shape)
