"""Safetensors codec: bit-exact round trips, int8 error bound, checksums catch corruption."""

from __future__ import annotations

import io
import json
import struct

import pytest
import safetensors
import safetensors.torch
import torch

from storage.errors import CorruptEntryError
from storage.kv.codec import (
    decode_page,
    decode_tensors,
    encode_page,
    encode_tensors,
    read_page,
)
from storage.kv.split import decode_split, encode_split, read_header
from tests.storage.kv_testkit import QWEN2VL_2B, SMALL, assert_same_page, make_page

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bit_exact_and_zero_copy(dtype: torch.dtype) -> None:
    page = make_page(1, QWEN2VL_2B, dtype)
    buf = bytearray(encode_page(page).to_bytes())
    back = decode_page(buf)
    assert_same_page(page, back)
    start = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    assert start <= back.keys.data_ptr() < start + len(buf)  # a view, not a copy


def test_plain_safetensors_readers_see_the_tensors_and_metadata() -> None:
    page = make_page(2)
    blob = encode_page(page).to_bytes()
    tensors = safetensors.torch.load(blob)
    assert torch.equal(tensors["keys"], page.keys) and torch.equal(tensors["embeds"],
                                                                   page.embeds)
    header_len = struct.unpack("<Q", blob[:8])[0]
    meta = json.loads(blob[8:8 + header_len])["__metadata__"]
    assert meta["format"] == "conduit.pagekv" and meta["version"] == "1"
    assert meta["quant"] == "none" and meta["checksum"].startswith("xxh3_128:")
    assert json.loads(meta["fingerprint"])["template_version"] == "page-v1"
    assert (8 + header_len) % 64 == 0


def test_non_contiguous_and_readonly_inputs() -> None:
    page = make_page(3)
    page.keys = page.keys.transpose(2, 3).contiguous().transpose(2, 3)
    assert not page.keys.is_contiguous()
    back = decode_page(encode_page(page).to_bytes())  # bytes: read-only, decoded with a copy
    assert_same_page(page, back)


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_round_trip_within_half_a_step(dtype: torch.dtype) -> None:
    page = make_page(4, QWEN2VL_2B, dtype)
    enc = encode_page(page, quantize=True)
    assert enc.nbytes < 0.6 * encode_page(page).nbytes * (2 if dtype == torch.float32 else 1)
    stored = decode_page(bytearray(enc.to_bytes()))
    # served in the int8 form (int8 plus scales: the runtime dequantises on its device)
    assert stored.quantized and stored.keys.dtype == torch.int8
    assert stored.compute_dtype == dtype and stored.nbytes < page.nbytes
    back = stored.dequantized()
    assert back.keys.dtype == dtype and back.values.dtype == dtype
    assert torch.equal(back.embeds, page.embeds)  # only keys/values are quantised
    rel = 2.0 ** -8 if dtype == torch.bfloat16 else 1e-6  # rounding of the output dtype
    k, v = page.keys.float(), page.values.float()
    # keys: per channel (amax over tokens); values: per token (amax over head_dim)
    k_bound = k.abs().amax(dim=2, keepdim=True) / 254 + rel * k.abs()
    v_bound = v.abs().amax(dim=3, keepdim=True) / 254 + rel * v.abs()
    assert ((back.keys.float() - k).abs() <= k_bound * 1.0001 + 1e-6).all()
    assert ((back.values.float() - v).abs() <= v_bound * 1.0001 + 1e-6).all()
    assert (back.keys.float() - k).abs().max() > 0  # it really is lossy


def _corruptions(blob: bytes) -> list[bytes]:
    header_len = struct.unpack("<Q", blob[:8])[0]
    data = 8 + header_len
    out = []
    for pos in (0, 5, 9, header_len // 2, header_len - 40, data, data + 777, len(blob) - 1):
        b = bytearray(blob)
        b[pos] ^= 0x01
        out.append(bytes(b))
    for cut in (0, 7, 8 + header_len // 2, data, data + 1, len(blob) - 1):
        out.append(blob[:cut])
    return out


def test_every_flipped_byte_or_truncation_is_detected() -> None:
    blob = encode_page(make_page(5)).to_bytes()
    for bad in _corruptions(blob):
        with pytest.raises(CorruptEntryError):
            decode_page(bytearray(bad))


@pytest.mark.parametrize("chunk", [7, 4096, 1 << 20])
def test_reading_in_chunks_verifies_every_byte(chunk: int) -> None:
    page = make_page(5, QWEN2VL_2B)
    blob = encode_page(page).to_bytes()
    assert_same_page(page, read_page(io.BytesIO(blob).readinto, len(blob), chunk))
    for bad in _corruptions(blob):
        with pytest.raises(CorruptEntryError):
            read_page(io.BytesIO(bad).readinto, len(bad), chunk)
    for short in (blob[:-1], blob[:100], b""):  # the source ends before the size it had
        with pytest.raises(CorruptEntryError):
            read_page(io.BytesIO(short).readinto, len(blob), chunk)


def test_pages_sharing_a_cached_header_layout_are_each_checked_against_their_own_sum() -> None:
    a, b = encode_page(make_page(1)).to_bytes(), encode_page(make_page(2)).to_bytes()
    at = a.index(b'"checksum":"xxh3_128:') + len(b'"checksum":"xxh3_128:')
    assert a[:at] == b[:at] and a[at:at + 32] != b[at:at + 32]  # one layout, two sums
    assert_same_page(make_page(1), decode_page(a))  # the layout is now cached
    _, meta = decode_tensors(b)
    meta["format"] = "changed by a caller"  # the caller's copy, not the cache's
    assert_same_page(make_page(2), decode_page(b))
    swapped = a[:at] + b[at:at + 32] + a[at + 32:]  # a's data under b's sum
    flipped = bytearray(a)
    flipped[at + 5] = ord("0") if a[at + 5] != ord("0") else ord("1")
    for bad in (swapped, bytes(flipped)):
        with pytest.raises(CorruptEntryError, match="checksum mismatch"):
            decode_page(bad)


def test_foreign_format_or_version_is_rejected() -> None:
    page = make_page(6)
    good = {"embeds": page.embeds, "keys": page.keys}
    for meta in ({"format": "other", "version": "1"},
                 {"format": "conduit.pagekv", "version": "2", "quant": "none"}):
        with pytest.raises(CorruptEntryError):
            decode_page(encode_tensors(good, meta).to_bytes())
    tensors, _ = decode_tensors(encode_tensors(good, {"format": "x"}).to_bytes())
    with pytest.raises(CorruptEntryError):  # right format, tensors missing
        decode_page(encode_tensors(tensors, {
            "format": "conduit.pagekv", "version": "1", "quant": "none",
            "fingerprint": page.fingerprint.to_json(), "layers": "3"}).to_bytes())


@pytest.mark.parametrize("quantize", [False, True])
def test_split_round_trip(quantize: bool) -> None:
    page = make_page(7, SMALL, torch.bfloat16)
    enc = encode_split(page, quantize=quantize)
    assert len(enc.layers) == 2 * page.keys.shape[0]
    assert max(v.nbytes for v in enc.layers) == page.keys[0].numel() * (
        1 if quantize else 2)
    back = decode_split(read_header(enc.header), [bytes(v) for v in enc.layers])
    if quantize:
        assert back.quantized and back.compute_dtype == page.keys.dtype
        assert_same_page(back, decode_page(encode_page(page, quantize=True).to_bytes()))
        back = back.dequantized()
        assert torch.allclose(back.keys.float(), page.keys.float(), atol=0.1, rtol=0.02)
    else:
        assert_same_page(page, back)


def test_split_partial_short_or_mixed_entries_are_corrupt() -> None:
    a, b = make_page(8), make_page(9)
    enc_a, enc_b = encode_split(a), encode_split(b)
    header = read_header(enc_a.header)
    layers = [bytes(v) for v in enc_a.layers]
    missing = list(layers)
    missing[3] = None  # type: ignore[call-overload]
    mixed = list(layers)
    mixed[2] = bytes(enc_b.layers[2])  # same shape, another page
    short = list(layers)
    short[1] = short[1][:-2]
    for parts in (missing, mixed, short, layers[:-1]):
        with pytest.raises(CorruptEntryError):
            decode_split(header, parts)
    for bad in _corruptions(enc_a.header):
        with pytest.raises(CorruptEntryError):
            read_header(bad)
    assert_same_page(a, decode_split(header, layers))
