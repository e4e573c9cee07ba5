"""Page thumbnails: a fixed set of widths and a byte-bounded LRU of their PNG bytes.

Before, every `?width=` request decoded the stored page PNG and resized it, for any width from
16 to 4096: one client asking for 4,000 widths of one page cost 4,000 decodes. A requested width
is now rounded up to the next of `WIDTHS` (at most 13 thumbnails per page; the reply says its
width), and the encoded thumbnails are kept in memory under a byte budget, least recently used
first out. A page's image never changes under its document id, so an entry is never stale; the
entries of a deleted document are dropped with it.
"""

from __future__ import annotations

import bisect
import io
import threading
from collections import OrderedDict
from pathlib import Path

from PIL import Image

# steps of about 1.4x; 240 and 1400 are the web page's thumbnail and enlarged widths
WIDTHS = (64, 96, 120, 160, 240, 320, 480, 640, 960, 1400, 2048, 3072, 4096)
CACHE_BYTES = 64 << 20  # encoded PNGs; a 240-px page thumbnail is about 20-60 KB


def thumbnail_width(requested: int) -> int:
    """The served width for a requested one: the smallest of `WIDTHS` at least as wide."""
    return WIDTHS[min(bisect.bisect_left(WIDTHS, requested), len(WIDTHS) - 1)]


def render_thumbnail(path: Path, width: int) -> bytes:
    """The PNG at `path` scaled to `width` (aspect ratio kept), as PNG bytes."""
    with Image.open(path) as img:
        height = max(1, round(img.height * width / img.width))
        thumb = img.convert("RGB").resize((width, height), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    thumb.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


class ThumbnailCache:
    """Encoded thumbnails keyed by (document id, image path, width), at most `max_bytes`."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.renders = 0  # thumbnails computed (misses), for tests and logs
        self._entries: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, document_id: str, path: Path, width: int) -> bytes:
        """The thumbnail, from memory or rendered now (and kept if it fits the budget)."""
        key = (document_id, str(path), width)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
        data = render_thumbnail(path, width)  # outside the lock: other pages keep being served
        with self._lock:
            self.renders += 1
            if key not in self._entries and len(data) <= self.max_bytes:
                self._entries[key] = data
                self.bytes += len(data)
                while self.bytes > self.max_bytes:
                    _, dropped = self._entries.popitem(last=False)
                    self.bytes -= len(dropped)
        return data

    def drop_document(self, document_id: str) -> None:
        """Forget a deleted document's thumbnails."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == document_id]:
                self.bytes -= len(self._entries.pop(key))

    def __len__(self) -> int:
        return len(self._entries)
