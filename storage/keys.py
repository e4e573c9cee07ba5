"""Page hashes: the content address of one page's cached KV.

The key covers everything that changes the cached tensors: the model fingerprint (name, revision,
dtype, config hash, page-context template version), the render settings, the rendered pixels
and the tenant namespace. Two pages share a KV entry only if every one of these is equal.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import asdict, dataclass
from typing import NewType

from PIL import Image

from conduit_core.page_kv import ModelFingerprint
from storage.errors import InvalidKeyError

PageHash = NewType("PageHash", str)

_KEY_VERSION = 1
_HEX = re.compile(r"[0-9a-f]{16,128}")


@dataclass(frozen=True)
class RenderSettings:
    """How a PDF page was rasterised: anything here changes the pixels the model sees."""

    dpi: int
    max_pixels: int


def cache_namespace(namespace: str | None) -> str:
    """The key the model runtime's cross-request caches (prompt head, page labels, choice
    history: `AnswerRequest.namespace`) use for pages of `namespace` (as `page_hash` takes
    it): one per tenant and one for the shared corpus, never equal to each other."""
    return "shared" if namespace is None else f"tenant:{namespace}"


def page_hash(
    *,
    fingerprint: ModelFingerprint,
    render: RenderSettings,
    image: Image.Image,
    namespace: str | None,
) -> PageHash:
    """The sha256 page hash of a rendered page for one model, render setting and tenant.

    `namespace` is the tenant that owns the page; `None` means an explicitly shared corpus
    (distinct from every tenant, including one named "").
    """
    descriptor = {
        "v": _KEY_VERSION,
        "fingerprint": asdict(fingerprint),
        "render": asdict(render),
        "namespace": namespace,
        "image": {"mode": image.mode, "size": list(image.size)},
    }
    head = json.dumps(descriptor, sort_keys=True, separators=(",", ":")).encode()
    h = hashlib.sha256()
    h.update(struct.pack("<Q", len(head)))
    h.update(head)
    h.update(image.tobytes())
    return PageHash(h.hexdigest())


def check_page_hash(key: str) -> PageHash:
    """Return `key` as a `PageHash` if it is a lowercase hex digest, else `InvalidKeyError`."""
    if not _HEX.fullmatch(key):
        raise InvalidKeyError(f"not a page hash: {key[:80]!r}")
    return PageHash(key)
