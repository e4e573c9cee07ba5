"""Staging of the page KV one question loads: one host buffer, one copy to the device.

Cached pages live on the host (`PageKV.to_host`). Copying them to an accelerator tensor by
tensor, from pageable memory, makes every copy a blocking one and costs a launch per tensor.
Here every tensor a question needs is laid out in one host buffer (`HostStage`: the caller
fills host views of the shapes it asked for, e.g. all pages' keys at their places in the
prompt), page-locked where CUDA is available, and the buffer goes to the device in one
`non_blocking` copy; the tensors come back as views of the device buffer, in the order asked
for. The copy is ordered before any kernel that reads it on the same stream, and the caching
host allocator keeps the pinned buffer alive until the copy has run, so nothing waits on the
host.

Public API:
  ALIGN = 64                            byte alignment of each tensor in the buffer
  HostStage(specs: [(shape, dtype)], device, pin=None)
      .host: list[Tensor]               views of the host buffer to fill
      .to_device() -> list[Tensor]      the same tensors on `device` (one copy; on the CPU
                                        the host views themselves)
  stage(tensors, device, pin=None) -> list[Tensor]   copies of `tensors` staged that way
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from conduit_core.page_kv import pin_host_memory

ALIGN = 64


class HostStage:
    """One host buffer (pinned where CUDA is available) holding tensors of `specs`, moved to
    `device` in one copy."""

    def __init__(self, specs: Sequence[tuple[Sequence[int], torch.dtype]],
                 device: torch.device | str, pin: bool | None = None):
        self.device = torch.device(device)
        on_cpu = self.device.type == "cpu"
        self.pin = (pin_host_memory() if pin is None else pin) and not on_cpu
        self._layout: list[tuple[int, torch.dtype, torch.Size]] = []
        total = 0
        for shape, dtype in specs:
            size = torch.Size(shape)
            self._layout.append((total, dtype, size))
            nbytes = size.numel() * torch.empty(0, dtype=dtype).element_size()
            total += -(-nbytes // ALIGN) * ALIGN
        self._buf = torch.empty(total, dtype=torch.uint8, pin_memory=self.pin)  # (bytes,)
        self.host = [_view(self._buf, *spec) for spec in self._layout]

    def to_device(self) -> list[torch.Tensor]:
        """The staged tensors on the device: one (non-blocking, when pinned) copy."""
        if self.device.type == "cpu":
            return list(self.host)
        buf = self._buf.to(self.device, non_blocking=self.pin)
        return [_view(buf, *spec) for spec in self._layout]


def stage(tensors: Sequence[torch.Tensor], device: torch.device | str,
          pin: bool | None = None) -> list[torch.Tensor]:
    """Copies of `tensors` on `device`, views of one buffer that crossed in one copy."""
    staged = HostStage([(t.shape, t.dtype) for t in tensors], device, pin)
    for view, t in zip(staged.host, tensors, strict=True):
        view.copy_(t)
    return staged.to_device()


def _view(buf: torch.Tensor, offset: int, dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
    """The tensor of `dtype` and `shape` at byte `offset` of the uint8 buffer `buf`."""
    nbytes = shape.numel() * torch.empty(0, dtype=dtype).element_size()
    return buf[offset:offset + nbytes].view(dtype).view(shape)
