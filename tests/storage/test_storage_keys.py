"""Page hashes: every input that changes the cached tensors changes the key."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PIL import Image

from storage.errors import InvalidKeyError
from storage.keys import RenderSettings, check_page_hash, page_hash
from tests.storage.kv_testkit import FINGERPRINT


def _image(color: tuple[int, int, int] = (200, 10, 10), size: tuple[int, int] = (40, 30),
           mode: str = "RGB") -> Image.Image:
    return Image.new("RGB", size, color).convert(mode)


RENDER = RenderSettings(dpi=100, max_pixels=1_000_000)


def _key(**overrides: object) -> str:
    args: dict[str, object] = {"fingerprint": FINGERPRINT, "render": RENDER,
                               "image": _image(), "namespace": "tenant-a"}
    args.update(overrides)
    return page_hash(**args)  # type: ignore[arg-type]


def test_page_hash_is_stable_hex() -> None:
    key = _key()
    assert key == _key() and len(key) == 64
    assert check_page_hash(key) == key


@pytest.mark.parametrize("field", ["name", "revision", "dtype", "config_hash",
                                   "template_version"])
def test_every_fingerprint_field_is_in_the_key(field: str) -> None:
    changed = replace(FINGERPRINT, **{field: getattr(FINGERPRINT, field) + "x"})
    assert _key(fingerprint=changed) != _key()


def test_render_image_and_namespace_are_in_the_key() -> None:
    base = _key()
    pixel = _image()
    pixel.putpixel((3, 4), (200, 10, 11))
    variants = [
        _key(render=RenderSettings(dpi=144, max_pixels=1_000_000)),
        _key(render=RenderSettings(dpi=100, max_pixels=999_999)),
        _key(image=pixel),
        _key(image=_image(size=(30, 40))),  # same bytes, other geometry
        _key(image=_image(mode="RGBA")),
        _key(namespace="tenant-b"),
        _key(namespace=""),
        _key(namespace=None),  # the explicitly shared corpus
    ]
    assert len({base, *variants}) == len(variants) + 1


@pytest.mark.parametrize("bad", ["../../etc/passwd", "ABCDEF0123456789", "abc", "a" * 200, ""])
def test_check_page_hash_rejects_unsafe_names(bad: str) -> None:
    with pytest.raises(InvalidKeyError):
        check_page_hash(bad)
