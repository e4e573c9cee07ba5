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

Pages read from a store arrive already staged: the disk tier reads each entry straight into a
host buffer of its own (`host_buffer`, pinned where CUDA is available) and returns the page's
tensors as views of it. `packed_to_device` moves such pages without filling a `HostStage`:
each page's buffer crosses as it is, one non-blocking copy a page into one device buffer, and
the tensors come back as views of it at the same offsets, so the only host pass over a page's
bytes is the read itself.

Public API:
  ALIGN = 64                            byte alignment of each tensor in the buffer
  HostStage(specs: [(shape, dtype)], device, pin=None)
      .host: list[Tensor]               views of the host buffer to fill
      .to_device() -> list[Tensor]      the same tensors on `device` (one copy; on the CPU
                                        the host views themselves)
  stage(tensors, device, pin=None) -> list[Tensor]   copies of `tensors` staged that way
  host_buffer(nbytes, pin=None) -> Tensor   (nbytes,) uint8, uninitialised, pinned when `pin`
                                        (default: where CUDA is available)
  packed_buffer(tensors) -> Tensor | None   the one host buffer all `tensors` view, when they
                                        are the bulk of it (a page as a store read it)
  packed_to_device(groups, device) -> list[list[Tensor]] | None
      each group's tensors on `device`, one copy a group's buffer; None unless every group is
      packed (then the caller stages)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from conduit_core.page_kv import pin_host_memory

ALIGN = 64
PACKED_SLACK = 1 << 20  # bytes of a packed buffer outside its tensors (an entry's header)


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


def host_buffer(nbytes: int, pin: bool | None = None) -> torch.Tensor:
    """An uninitialised `(nbytes,)` uint8 host tensor, page-locked when `pin` (default:
    `pin_host_memory()`), for a store to read an entry into."""
    pin = pin_host_memory() if pin is None else pin
    if pin:  # the caching host allocator keeps freed blocks for the next read
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)  # (nbytes,)
    # malloc's: glibc hands a freed buffer to the next read as it is, where torch's aligned
    # allocation of a large buffer is mapped afresh and faulted in page by page each time
    return torch.from_numpy(np.empty(nbytes, dtype=np.uint8))  # (nbytes,)


def packed_buffer(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The whole host buffer (uint8) that every one of `tensors` views, contiguously, when
    the tensors fill all of it but `PACKED_SLACK` bytes; None otherwise (tensors of separate
    buffers, on a device, strided, or a small part of a larger buffer: copying that buffer
    would move bytes the tensors do not hold)."""
    if not tensors:
        return None
    storage = tensors[0].untyped_storage()
    for t in tensors:
        if (t.device.type != "cpu" or not t.is_contiguous()
                or t.untyped_storage().data_ptr() != storage.data_ptr()):
            return None
    held = sum(t.numel() * t.element_size() for t in tensors)
    if storage.nbytes() > held + PACKED_SLACK:
        return None
    return torch.empty(0, dtype=torch.uint8).set_(storage)  # (storage bytes,)


def packed_to_device(groups: Sequence[Sequence[torch.Tensor]], device: torch.device | str
                     ) -> list[list[torch.Tensor]] | None:
    """Each group's tensors on `device` as views of one device buffer that every group's
    packed host buffer (`packed_buffer`) crossed into, one copy a group (non-blocking when
    the buffer is pinned and the device is CUDA; a copy on the CPU too, where only tests
    stage). None when any group is not packed."""
    device = torch.device(device)
    bufs: list[torch.Tensor] = []
    for group in groups:
        buf = packed_buffer(group)
        if buf is None:
            return None
        bufs.append(buf)
    sizes = [-(-b.numel() // ALIGN) * ALIGN for b in bufs]
    dev = torch.empty(sum(sizes), dtype=torch.uint8, device=device)  # (bytes,)
    out: list[list[torch.Tensor]] = []
    at = 0
    for group, buf, size in zip(groups, bufs, sizes, strict=True):
        pinned = device.type == "cuda" and buf.is_pinned()
        dev[at:at + buf.numel()].copy_(buf, non_blocking=pinned)  # the page's one copy
        out.append([_view(dev, at + int(t.storage_offset()) * t.element_size(), t.dtype, t.shape)
                    for t in group])
        at += size
    return out
