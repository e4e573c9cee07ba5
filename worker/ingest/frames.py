"""The page reader's wire format: a JSON header and an optional raw payload, no pickle.

A frame is a 4-byte big-endian header length, the UTF-8 JSON header (whose `blob` field is
the payload length) and the payload bytes: the PDF going to the reader, raw RGB pixels
coming back.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import IO, Any

_LENGTH = struct.Struct(">I")
MAX_HEADER = 16 * 2**20


class ReaderGone(Exception):
    """The other end closed the pipe (the reader process ended)."""


class ReaderTimeout(Exception):
    """No complete frame arrived before the deadline."""


def write_frame(out: IO[bytes], header: dict[str, Any], blob: bytes = b"") -> None:
    """Send one frame and flush it."""
    head = json.dumps({**header, "blob": len(blob)}).encode()
    try:
        out.write(_LENGTH.pack(len(head)) + head)
        if blob:
            out.write(blob)
        out.flush()
    except (BrokenPipeError, ValueError) as exc:  # ValueError: the pipe was closed here
        raise ReaderGone() from exc


def read_frame(stream: IO[bytes]) -> tuple[dict[str, Any], bytes]:
    """Block until one frame arrives on a file object (the reader's side)."""
    head = _read_exact(lambda n: stream.read(n), _LENGTH.size)
    header: dict[str, Any] = json.loads(_read_exact(lambda n: stream.read(n),
                                                    _checked(_LENGTH.unpack(head)[0])))
    return header, _read_exact(lambda n: stream.read(n), int(header.get("blob", 0)))


def read_frame_fd(fd: int, deadline: float,
                  max_blob: int | None = None) -> tuple[dict[str, Any], bytes]:
    """Read one frame from a pipe's descriptor, giving up (`ReaderTimeout`) at `deadline`
    (a `time.monotonic()` value). A payload longer than `max_blob` is not read: the other
    end is treated as broken (`ReaderGone`)."""

    def chunk(n: int) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise ReaderTimeout()
        return os.read(fd, min(n, 1 << 20))

    head = _read_exact(chunk, _LENGTH.size)
    header: dict[str, Any] = json.loads(_read_exact(chunk, _checked(_LENGTH.unpack(head)[0])))
    size = int(header.get("blob", 0))
    if max_blob is not None and size > max_blob:
        raise ReaderGone()
    return header, _read_exact(chunk, size)


def _checked(length: int) -> int:
    if length > MAX_HEADER:
        raise ReaderGone()  # not our protocol: treat the reader as broken
    return length


def _read_exact(read: Any, size: int) -> bytes:
    parts: list[bytes] = []
    left = size
    while left:
        data = read(left)
        if not data:
            raise ReaderGone()
        parts.append(data)
        left -= len(data)
    return b"".join(parts)
