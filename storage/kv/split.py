"""Per-layer split encoding of a `PageKV`, for stores with a per-value size limit (Redis).

An entry becomes one small header value plus two raw values per layer (that layer's keys and
its values, `(kv_heads, T, head_dim)` each, zero-copy views of the tensors). The header is a
`codec.encode_tensors` entry holding the non-layer tensors (embeddings, positions, token ids,
image grid, int8 scales) and, in its checksummed metadata, the layer shape, dtype and one
checksum per layer value. A missing, short or foreign layer value makes the whole entry
corrupt: a partially evicted or mixed entry is never returned.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from conduit_core.page_kv import PageKV
from storage.errors import CorruptEntryError
from storage.kv.codec import (
    DTYPE_NAMES,
    NAME_DTYPES,
    assemble_page,
    check_metadata,
    checksum,
    decode_tensors,
    encode_tensors,
    page_metadata,
    tensor_bytes,
)
from storage.kv.quant import int8_parts


@dataclass(frozen=True)
class SplitEncoded:
    """Header value and layer values `[k0, v0, k1, v1, ...]` of one entry."""

    header: bytes
    layers: tuple[memoryview, ...]

    @property
    def nbytes(self) -> int:
        """Total bytes of all values."""
        return len(self.header) + sum(v.nbytes for v in self.layers)


def encode_split(page: PageKV, *, quantize: bool = False) -> SplitEncoded:
    """Split-encode a page: header bytes plus zero-copy per-layer key and value buffers."""
    tensors = {"embeds": page.embeds, "position_ids": page.position_ids,
               "token_ids": page.token_ids, "image_grid": page.image_grid}
    if quantize:
        keys, tensors["keys.scale"], values, tensors["values.scale"] = int8_parts(page)
    else:
        page = page.dequantized()
        keys, values = page.keys, page.values
    keys = keys.detach().cpu().contiguous()
    values = values.detach().cpu().contiguous()
    layers: list[memoryview] = []
    for layer in range(keys.shape[0]):
        layers.append(tensor_bytes(keys[layer]))
        layers.append(tensor_bytes(values[layer]))
    meta = page_metadata(page, "int8" if quantize else "none", page.compute_dtype)
    meta["split"] = "1"
    meta["layer_shape"] = json.dumps(list(keys.shape[1:]))
    meta["layer_dtype"] = DTYPE_NAMES[keys.dtype]
    meta["layer_checksums"] = json.dumps([checksum(v) for v in layers])
    return SplitEncoded(header=encode_tensors(tensors, meta).to_bytes(), layers=tuple(layers))


@dataclass(frozen=True)
class SplitHeader:
    """A verified header value: its tensors, metadata and the number of layer values."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, str]
    n_values: int
    layer_shape: list[int]
    layer_dtype: torch.dtype
    layer_checksums: list[str]


def read_header(buf: bytes | bytearray | memoryview) -> SplitHeader:
    """Verify and parse a split header value (`CorruptEntryError` if it is not one)."""
    tensors, meta = decode_tensors(buf)
    check_metadata(meta)
    try:
        n_values = 2 * int(meta["layers"])
        sums = [str(s) for s in json.loads(meta["layer_checksums"])]
        shape = [int(s) for s in json.loads(meta["layer_shape"])]
        dtype = NAME_DTYPES[meta["layer_dtype"]]
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptEntryError(f"bad split header: {exc}") from exc
    if len(sums) != n_values:
        raise CorruptEntryError("split header checksum count disagrees with its layer count")
    return SplitHeader(tensors=tensors, meta=meta, n_values=n_values, layer_shape=shape,
                       layer_dtype=dtype, layer_checksums=sums)


def decode_split(header: SplitHeader,
                 layers: Sequence[bytes | bytearray | memoryview | None]) -> PageKV:
    """Verify every layer value against the header and rebuild the page; any missing, short
    or mismatched value makes the entry corrupt (never a mix of two writes)."""
    tensors, meta, n_values = header.tensors, header.meta, header.n_values
    shape, dtype, sums = header.layer_shape, header.layer_dtype, header.layer_checksums
    if len(layers) != n_values:
        raise CorruptEntryError(f"entry has {len(layers)} of {n_values} layer values")
    n_layers = n_values // 2
    keys = torch.empty([n_layers, *shape], dtype=dtype)
    values = torch.empty([n_layers, *shape], dtype=dtype)
    dst_k = keys.view(torch.uint8).numpy().reshape(n_layers, -1)
    dst_v = values.view(torch.uint8).numpy().reshape(n_layers, -1)
    for i, part in enumerate(layers):
        if part is None:
            raise CorruptEntryError(f"layer value {i} is missing (partially evicted entry)")
        dst = (dst_k if i % 2 == 0 else dst_v)[i // 2]
        src = np.frombuffer(part, dtype=np.uint8)
        if src.nbytes != dst.nbytes or checksum(part) != sums[i]:
            raise CorruptEntryError(f"layer value {i} does not belong to this header")
        dst[:] = src
    try:
        scales = ((tensors["keys.scale"], tensors["values.scale"])
                  if meta["quant"] == "int8" else None)  # int8 stays int8 (int8 form)
        return assemble_page(tensors, keys, values, meta, scales=scales)
    except KeyError as exc:
        raise CorruptEntryError(f"entry lacks tensor {exc}") from exc
