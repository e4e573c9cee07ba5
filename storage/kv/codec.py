"""Safetensors serialisation of `PageKV` with a checksum verified on every read.

The file is plain safetensors (readable by `safetensors.safe_open`), written piecewise so no
joined copy of the tensor bytes is made: an 8-byte header length, the JSON header padded to a
64-byte boundary, then each tensor's raw bytes (largest element size first, so every tensor is
naturally aligned). The header's `__metadata__` holds the format name and version, the model
fingerprint JSON, the quantisation, and an xxh3-128 checksum over the canonical header (minus
the checksum) and all tensor bytes. `decode_*` and `read_*` raise `CorruptEntryError` on any
mismatch; stores treat that as a miss and remove the entry.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from conduit_core.kv.staging import host_buffer
from conduit_core.page_kv import ModelFingerprint, PageKV
from storage.errors import CorruptEntryError
from storage.kv.quant import int8_parts

FORMAT = "conduit.pagekv"
VERSION = "1"
CHECKSUM_ALGO = "xxh3_128"
_ALIGN = 64
_MAX_HEADER = 64 * 1024 * 1024

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
NAME_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}
_TORCH_DTYPES = {str(d).removeprefix("torch."): d for d in DTYPE_NAMES}


@dataclass(frozen=True)
class Encoded:
    """A serialised entry as buffers to write in order; `to_bytes` joins them (one copy)."""

    parts: tuple[bytes | memoryview, ...]
    nbytes: int

    def to_bytes(self) -> bytes:
        """The whole entry as one bytes object."""
        return b"".join(self.parts)


def checksum(*buffers: bytes | bytearray | memoryview) -> str:
    """The checksum string (`xxh3_128:<hex>`) of the concatenation of `buffers`."""
    h = xxhash.xxh3_128()
    for b in buffers:
        h.update(b)
    return f"{CHECKSUM_ALGO}:{h.hexdigest()}"


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a CPU tensor (made contiguous on the CPU first if needed)."""
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().data


def dtype_name(dtype: torch.dtype) -> str:
    """The torch dtype's short name, e.g. `bfloat16`."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """Inverse of `dtype_name`; `CorruptEntryError` for an unknown name."""
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise CorruptEntryError(f"unknown dtype {name!r}") from None


def _canonical(header: Mapping[str, Any]) -> bytes:
    return json.dumps(header, sort_keys=True, separators=(",", ":")).encode()


def encode_tensors(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> Encoded:
    """Serialise named tensors and string metadata as checksummed safetensors pieces."""
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header: dict[str, Any] = {}
    views: list[memoryview] = []
    offset = 0
    for name in order:
        t = tensors[name]
        view = tensor_bytes(t)
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + view.nbytes]}
        views.append(view)
        offset += view.nbytes
    meta = dict(metadata)
    meta.pop("checksum", None)
    header["__metadata__"] = meta
    meta_sum = checksum(_canonical(header), *views)
    header["__metadata__"] = {**meta, "checksum": meta_sum}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % _ALIGN)
    head = struct.pack("<Q", len(blob)) + blob
    return Encoded(parts=(head, *views), nbytes=len(head) + offset)


Span = tuple[torch.dtype, list[int], int, int]  # dtype, shape, begin, end in the data section


@dataclass(frozen=True)
class Header:
    """A parsed, layout-checked entry header; the checksum is verified separately."""

    data_offset: int
    spans: dict[str, Span]
    meta: dict[str, str]
    stored_sum: str
    canonical: bytes

    def verify(self, data: bytes | bytearray | memoryview) -> None:
        """`CorruptEntryError` unless the header and `data` match the stored checksum."""
        if checksum(self.canonical, data) != self.stored_sum:
            raise CorruptEntryError("checksum mismatch")

    def tensors(self, data: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Views into `data` (the data section as a flat uint8 tensor)."""
        out: dict[str, torch.Tensor] = {}
        for name, (dtype, shape, begin, end) in self.spans.items():
            if data is None or begin == end:
                out[name] = torch.empty(shape, dtype=dtype)
            else:
                out[name] = data[begin:end].view(dtype).reshape(shape)
        return out


def header_length(prefix: memoryview) -> int:
    """Bytes taken by the length field and JSON header, read from the first 8 bytes."""
    if prefix.nbytes < 8:
        raise CorruptEntryError("entry shorter than its header length")
    (n,) = struct.unpack_from("<Q", prefix, 0)
    if n > _MAX_HEADER:
        raise CorruptEntryError("implausible header length")
    return 8 + int(n)


_SUM_FIELD = b'"checksum":"'


def parse_header(head: memoryview, total: int) -> Header:
    """Parse the header at the start of `head` for an entry of `total` bytes.

    The checksum's value is cut out of the JSON text and the rest parsed through a small cache
    (`_layout`): the entries of one model differ only in it, and parsing, validating and
    re-serialising a header cold took about a tenth of reading a 16 MB page.
    """
    offset = header_length(head)
    if offset > head.nbytes or offset > total:
        raise CorruptEntryError("truncated header")
    raw = bytes(head[8:offset])
    at = raw.rfind(_SUM_FIELD)
    start = at + len(_SUM_FIELD)
    end = raw.find(b'"', start) if at >= 0 else -1
    if end < 0:
        raise CorruptEntryError("unreadable header: no checksum")
    spans, meta, canonical = _layout(raw[:start] + raw[end:], total - offset)
    return Header(data_offset=offset, spans=spans, meta=dict(meta),
                  stored_sum=raw[start:end].decode("ascii", "replace"), canonical=canonical)


@functools.lru_cache(maxsize=64)
def _layout(blanked: bytes, data_len: int) -> tuple[dict[str, Span], dict[str, str], bytes]:
    """Tensor spans, metadata (less the checksum) and the canonical form the checksum covers,
    of a header JSON whose checksum value is empty (a pure function of it: cached)."""
    try:
        header = json.loads(blanked)
        meta = header["__metadata__"]
        if meta.pop("checksum") != "":
            raise ValueError("two checksums")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptEntryError(f"unreadable header: {exc}") from exc
    spans = _validate_layout(header, data_len)
    return spans, {str(k): str(v) for k, v in meta.items()}, _canonical(header)


def decode_tensors(buf: bytes | bytearray | memoryview) -> tuple[dict[str, torch.Tensor],
                                                                  dict[str, str]]:
    """Parse and verify `encode_tensors` output; tensors are zero-copy views when `buf` is
    writable (e.g. a bytearray), otherwise one copy of the data section is made."""
    mv = memoryview(buf).cast("B")
    head = parse_header(mv, mv.nbytes)
    data = mv[head.data_offset:]
    head.verify(data)
    base: torch.Tensor | None = None
    if data.nbytes:
        base = torch.frombuffer(bytearray(data) if mv.readonly else data, dtype=torch.uint8)
    return head.tensors(base), head.meta


# Bytes read per call, each hashed while it is still in the CPU cache: the kernel's copy of a
# chunk moves its source and its destination through the core's L2, and at 512 KB both stay
# there for the hash in a 2 MB L2 (measured: lab/store/NOTES.md).
READ_CHUNK = 1 << 19

ReadInto = Callable[[memoryview], "int | None"]


def _fill(readinto: ReadInto, mv: memoryview, done: int, end: int) -> int:
    """Read into `mv[done:end]` until it is full or the source ends; the new `done`."""
    while done < end and (n := readinto(mv[done:end])):
        done += n
    return done


def read_tensors(readinto: ReadInto, size: int, chunk: int = READ_CHUNK
                 ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Read an entry of `size` bytes through `readinto` (e.g. a raw file's), verifying it.

    One private, uninitialised host buffer receives the bytes (`conduit_core.kv.staging.
    host_buffer`: no zero-filling pass, page-locked where CUDA is available, so the runtime
    copies it to the device as it is), `chunk` bytes per read, each hashed as it lands: the
    kernel's copy is the only pass over memory besides a cache-hot hash, and the tensors
    returned view the buffer (no further copy). `CorruptEntryError` for a short read, a bad
    header or a checksum mismatch.
    """
    buf = host_buffer(size)  # (size,) uint8
    mv = buf.numpy().data  # the tensor's own memory
    done = _fill(readinto, mv, 0, min(size, max(chunk, 8)))  # 8: the header length
    offset = header_length(mv[:done])
    done = _fill(readinto, mv, done, min(size, max(offset, done)))
    head = parse_header(mv[:done], size)
    h = xxhash.xxh3_128(head.canonical)
    h.update(mv[offset:done])
    while done < size:
        start, done = done, _fill(readinto, mv, done, min(size, done + chunk))
        if done == start:
            raise CorruptEntryError(f"entry is {done} bytes, expected {size}")
        h.update(mv[start:done])
    if f"{CHECKSUM_ALGO}:{h.hexdigest()}" != head.stored_sum:
        raise CorruptEntryError("checksum mismatch")
    base = buf[offset:] if size > offset else None  # (data bytes,) views the whole buffer
    return head.tensors(base), head.meta


def _validate_layout(header: dict[str, Any], data_len: int
                     ) -> dict[str, tuple[torch.dtype, list[int], int, int]]:
    spans: dict[str, tuple[torch.dtype, list[int], int, int]] = {}
    try:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = NAME_DTYPES[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
            itemsize = dtype.itemsize
            size = math.prod(shape) * itemsize
            if min(shape, default=0) < 0 or end - begin != size or begin % itemsize:
                raise CorruptEntryError(f"tensor {name!r} has inconsistent size")
            spans[name] = (dtype, shape, begin, end)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptEntryError(f"bad tensor descriptor: {exc}") from exc
    pos = 0
    for _, _, begin, end in sorted(spans.values(), key=lambda s: (s[2], s[3])):
        if begin != pos:
            raise CorruptEntryError("tensor data has holes or overlaps")
        pos = end
    if pos != data_len:
        raise CorruptEntryError(f"data section is {data_len} bytes, header covers {pos}")
    return spans


def page_metadata(page: PageKV, quant: str, kv_dtype: torch.dtype) -> dict[str, str]:
    """The metadata fields every page entry carries."""
    return {
        "format": FORMAT, "version": VERSION, "fingerprint": page.fingerprint.to_json(),
        "quant": quant, "kv_dtype": dtype_name(kv_dtype),
        "layers": str(page.keys.shape[0]), "num_tokens": str(page.num_tokens),
    }


def check_metadata(meta: Mapping[str, str]) -> None:
    """`CorruptEntryError` unless the metadata names this format and version."""
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise CorruptEntryError(
            f"not a {FORMAT} v{VERSION} entry: {meta.get('format')} v{meta.get('version')}")
    if meta.get("quant") not in ("none", "int8"):
        raise CorruptEntryError(f"unknown quantisation {meta.get('quant')!r}")


def encode_page(page: PageKV, *, quantize: bool = False) -> Encoded:
    """Serialise a whole page (keys and values as computed, or int8 with scales; a page in
    the int8 form is written as it is, or dequantised for a float entry)."""
    tensors = {"embeds": page.embeds, "position_ids": page.position_ids,
               "token_ids": page.token_ids, "image_grid": page.image_grid}
    if quantize:
        (tensors["keys.q"], tensors["keys.scale"], tensors["values.q"],
         tensors["values.scale"]) = int8_parts(page)
    else:
        page = page.dequantized()
        tensors["keys"], tensors["values"] = page.keys, page.values
    meta = page_metadata(page, "int8" if quantize else "none", page.compute_dtype)
    return encode_tensors(tensors, meta)


def decode_page(buf: bytes | bytearray | memoryview) -> PageKV:
    """Verify and deserialise an `encode_page` entry (an int8 entry as an int8 page)."""
    return page_from_tensors(*decode_tensors(buf))


def read_page(readinto: ReadInto, size: int, chunk: int = READ_CHUNK) -> PageKV:
    """`decode_page` of an entry read through `readinto` (see `read_tensors`)."""
    return page_from_tensors(*read_tensors(readinto, size, chunk))


def page_from_tensors(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, str]) -> PageKV:
    """Build a page from a verified entry's tensors and metadata."""
    check_metadata(meta)
    try:
        if meta["quant"] == "int8":
            return assemble_page(tensors, tensors["keys.q"], tensors["values.q"], meta,
                                 scales=(tensors["keys.scale"], tensors["values.scale"]))
        return assemble_page(tensors, tensors["keys"], tensors["values"], meta)
    except KeyError as exc:
        raise CorruptEntryError(f"entry lacks tensor {exc}") from exc


def assemble_page(tensors: Mapping[str, torch.Tensor], keys: torch.Tensor,
                  values: torch.Tensor, meta: Mapping[str, str],
                  scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> PageKV:
    """Build a `PageKV` from decoded parts, checking the shapes agree; with `scales` (keys',
    values') the int8 form, dequantising to the entry's `kv_dtype`."""
    try:
        fingerprint = _fingerprint(meta["fingerprint"])
        kv_dtype = torch_dtype(meta["kv_dtype"]) if scales is not None else None
        page = PageKV(embeds=tensors["embeds"], keys=keys, values=values,
                      position_ids=tensors["position_ids"], token_ids=tensors["token_ids"],
                      image_grid=tensors["image_grid"], fingerprint=fingerprint,
                      key_scale=scales[0] if scales else None,
                      value_scale=scales[1] if scales else None, kv_dtype=kv_dtype)
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptEntryError(f"bad page entry: {exc}") from exc
    t = page.num_tokens
    if (keys.shape != values.shape or keys.dim() != 4 or keys.shape[2] != t
            or page.embeds.shape[0] != t or page.position_ids.shape[-1] != t
            or str(keys.shape[0]) != meta.get("layers")):
        raise CorruptEntryError("tensor shapes disagree")
    if scales is not None and (
            scales[0].shape != (*keys.shape[:2], 1, keys.shape[3])
            or scales[1].shape != (*keys.shape[:3], 1)):
        raise CorruptEntryError("int8 scale shapes disagree with the keys and values")
    return page


@functools.lru_cache(maxsize=64)
def _fingerprint(text: str) -> ModelFingerprint:
    """`ModelFingerprint.from_json`, cached (it is immutable; one model's pages share it)."""
    return ModelFingerprint.from_json(text)


def quantize_roundtrip(page: PageKV) -> PageKV:
    """The page exactly as an int8 tier would return it (for tiers that keep full tensors)."""
    return decode_page(bytearray(encode_page(page, quantize=True).to_bytes()))

