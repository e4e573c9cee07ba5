"""Safetensors serialisation of `PageKV` with a checksum verified on every read.

The file is plain safetensors (readable by `safetensors.safe_open`), written piecewise so no
joined copy of the tensor bytes is made: an 8-byte header length, the JSON header padded to a
64-byte boundary, then each tensor's raw bytes (largest element size first, so every tensor is
naturally aligned). The header's `__metadata__` holds the format name and version, the model
fingerprint JSON, the quantisation, and an xxh3-128 checksum over the canonical header (minus
the checksum) and all tensor bytes. `decode_*` raise `CorruptEntryError` on any mismatch;
stores treat that as a miss and remove the entry.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from conduit_core.page_kv import ModelFingerprint, PageKV
from storage.errors import CorruptEntryError
from storage.kv.quant import dequantize, quantize_keys, quantize_values

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


def decode_tensors(buf: bytes | bytearray | memoryview) -> tuple[dict[str, torch.Tensor],
                                                                  dict[str, str]]:
    """Parse and verify `encode_tensors` output; tensors are zero-copy views when `buf` is
    writable (e.g. a bytearray), otherwise one copy of the data section is made."""
    mv = memoryview(buf).cast("B")
    if mv.nbytes < 8:
        raise CorruptEntryError("entry shorter than its header length")
    (n,) = struct.unpack_from("<Q", mv, 0)
    if n > _MAX_HEADER or 8 + n > mv.nbytes:
        raise CorruptEntryError("truncated header")
    try:
        header = json.loads(bytes(mv[8:8 + n]))
        meta = header["__metadata__"]
        stored_sum = meta.pop("checksum")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptEntryError(f"unreadable header: {exc}") from exc
    data = mv[8 + n:]
    spans = _validate_layout(header, data.nbytes)
    if checksum(_canonical(header), data) != stored_sum:
        raise CorruptEntryError("checksum mismatch")
    if mv.readonly:
        base = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data.nbytes else None
    else:
        base = torch.frombuffer(data, dtype=torch.uint8) if data.nbytes else None
    out: dict[str, torch.Tensor] = {}
    for name, (dtype, shape, begin, end) in spans.items():
        if base is None or begin == end:
            out[name] = torch.empty(shape, dtype=dtype)
        else:
            out[name] = base[begin:end].view(dtype).reshape(shape)
    return out, {str(k): str(v) for k, v in meta.items()}


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
            itemsize = torch.empty((), dtype=dtype).element_size()
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
    """Serialise a whole page (keys and values as computed, or int8 with scales)."""
    tensors = {"embeds": page.embeds, "position_ids": page.position_ids,
               "token_ids": page.token_ids, "image_grid": page.image_grid}
    if quantize:
        tensors["keys.q"], tensors["keys.scale"] = quantize_keys(page.keys)
        tensors["values.q"], tensors["values.scale"] = quantize_values(page.values)
    else:
        tensors["keys"], tensors["values"] = page.keys, page.values
    meta = page_metadata(page, "int8" if quantize else "none", page.keys.dtype)
    return encode_tensors(tensors, meta)


def decode_page(buf: bytes | bytearray | memoryview) -> PageKV:
    """Verify and deserialise an `encode_page` entry (dequantising int8 to the stored dtype)."""
    tensors, meta = decode_tensors(buf)
    check_metadata(meta)
    try:
        if meta["quant"] == "int8":
            kv_dtype = torch_dtype(meta["kv_dtype"])
            keys = dequantize(tensors["keys.q"], tensors["keys.scale"], kv_dtype)
            values = dequantize(tensors["values.q"], tensors["values.scale"], kv_dtype)
        else:
            keys, values = tensors["keys"], tensors["values"]
        return assemble_page(tensors, keys, values, meta)
    except KeyError as exc:
        raise CorruptEntryError(f"entry lacks tensor {exc}") from exc


def assemble_page(tensors: Mapping[str, torch.Tensor], keys: torch.Tensor,
                  values: torch.Tensor, meta: Mapping[str, str]) -> PageKV:
    """Build a `PageKV` from decoded parts, checking the shapes agree."""
    try:
        fingerprint = ModelFingerprint.from_json(meta["fingerprint"])
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptEntryError(f"bad fingerprint: {exc}") from exc
    page = PageKV(embeds=tensors["embeds"], keys=keys, values=values,
                  position_ids=tensors["position_ids"], token_ids=tensors["token_ids"],
                  image_grid=tensors["image_grid"], fingerprint=fingerprint)
    t = page.num_tokens
    if (keys.shape != values.shape or keys.dim() != 4 or keys.shape[2] != t
            or page.embeds.shape[0] != t or page.position_ids.shape[-1] != t
            or str(keys.shape[0]) != meta.get("layers")):
        raise CorruptEntryError("tensor shapes disagree")
    return page


def quantize_roundtrip(page: PageKV) -> PageKV:
    """The page exactly as an int8 tier would return it (for tiers that keep full tensors)."""
    return decode_page(bytearray(encode_page(page, quantize=True).to_bytes()))

