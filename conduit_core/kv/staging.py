"""Page KV crossing to the device: every page of a question in one batched copy, no host pass.

Cached pages live on the host (`PageKV.to_host`, page-locked where CUDA is available; the
disk tier reads each entry straight into a host buffer of its own, `host_buffer`, and returns
the page's tensors as views of it). `pages_to_device` gives them their places in one device
buffer, each region aligned to `ALIGN` bytes, and moves them all in one batched copy
(`torch._foreach_copy_`: one operation issued whatever the number of pages, non-blocking on
CUDA): a page that views one buffer (`packed_buffer`) crosses as that buffer, any other page
tensor by tensor. Nothing joins the pages on the host first, so the only host pass over a
page's bytes is the read that brought it there. The tensors come back as views of the device
buffer. A copy from page-locked memory is ordered before any kernel that reads it on the same
stream, and the caching host allocator keeps the buffer alive until the copy has run, so
nothing waits on the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from conduit_core.page_kv import pin_host_memory

ALIGN = 64
PACKED_SLACK = 1 << 20  # bytes of a packed buffer outside its tensors (an entry's header)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


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
    if storage.nbytes() > sum(_nbytes(t) for t in tensors) + PACKED_SLACK:
        return None
    whole = (storage.nbytes(),)  # a view of every byte of the storage, from its start
    return tensors[0].reshape(-1).view(torch.uint8).as_strided(whole, (1,), 0)  # (bytes,)


def pages_to_device(groups: Sequence[Sequence[torch.Tensor]], device: torch.device | str
                    ) -> list[list[torch.Tensor]]:
    """Each group's tensors (a page's, on the host) on `device`: views of one device buffer
    that every group crossed into in one batched copy (module docstring); a packed group
    (`packed_buffer`) as its whole buffer, the tensors at the same offsets in it, any other
    group tensor by tensor, each at an `ALIGN`ed offset of its own."""
    device = torch.device(device)
    sources: list[torch.Tensor] = []  # host tensors to copy, each to the region at `starts`
    starts: list[int] = []
    places: list[list[int]] = []  # byte offset of each group's tensors in the device buffer
    at = 0
    for group in groups:
        buf = packed_buffer(group)
        if buf is not None:
            sources.append(buf)
            starts.append(at)
            places.append([at + int(t.storage_offset()) * t.element_size() for t in group])
            at += -(-buf.numel() // ALIGN) * ALIGN
            continue
        places.append([])
        for t in group:
            sources.append(t)
            starts.append(at)
            places[-1].append(at)
            at += -(-_nbytes(t) // ALIGN) * ALIGN
    dev = torch.empty(at, dtype=torch.uint8, device=device)  # (bytes,)
    targets = [_view(dev, start, src.dtype, src.shape) for src, start in zip(
        sources, starts, strict=True)]
    if sources:  # the one copy, non-blocking where the sources are page-locked
        torch._foreach_copy_(targets, sources, non_blocking=device.type == "cuda")
    return [[_view(dev, place, t.dtype, t.shape) for t, place in zip(group, offsets, strict=True)]
            for group, offsets in zip(groups, places, strict=True)]
