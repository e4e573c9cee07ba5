"""Cursor pagination of the API's lists: bounded pages that never repeat or skip an item.

Every list is ordered oldest first by its items' (created_at, id); a page holds at most
`limit` items after the cursor `after`, and the next page's cursor is the last item's key
(opaque to clients: URL-safe base64 of JSON). An item added between pages sorts after every
item listed so far (it is newer) and a deleted one moves nothing, so walking the pages returns
every item that lived through the walk exactly once, whatever is added or deleted meanwhile.
A cursor that does not decode is a 422. Lists that are JSON arrays give the next cursor in the
`X-Next-Cursor` header (absent on the last page); `/v1/models` keeps OpenAI's list object and
adds `has_more` and `next_cursor` to it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from typing import Annotated, TypeVar

from fastapi import HTTPException, Query

PAGE_DEFAULT = 100
PAGE_MAX = 1000
NEXT_HEADER = "X-Next-Cursor"

Limit = Annotated[int, Query(ge=1, le=PAGE_MAX, description="Items per page (at most 1000).")]
After = Annotated[str | None, Query(max_length=256, description="The cursor of the previous "
                                                                "page (its X-Next-Cursor).")]

T = TypeVar("T")
Key = tuple[float, str]


def encode_cursor(key: Key) -> str:
    """The opaque cursor of an item's sort key."""
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


def decode_cursor(cursor: str) -> Key:
    """The sort key a cursor names; 422 for anything `encode_cursor` did not make."""
    try:
        created, ident = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if isinstance(created, (int, float)) and isinstance(ident, str):
            return float(created), ident
    except (ValueError, TypeError, binascii.Error):
        pass
    raise HTTPException(422, "the cursor `after` is not one this service gave out")


def page_after(items: Sequence[T], key: Callable[[T], Key], after: str | None,
               limit: int) -> tuple[list[T], str | None]:
    """The items after the cursor `after` in key order, at most `limit` of them, and the next
    page's cursor (None on the last page)."""
    start = decode_cursor(after) if after else None
    rest = sorted((i for i in items if start is None or key(i) > start), key=key)
    page = rest[:limit]
    return page, (encode_cursor(key(page[-1])) if len(rest) > limit else None)
