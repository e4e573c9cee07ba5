"""What a tenant stores (`Usage`) and how much it may (`Quota`), counted from the records.

Usage is the tenant's documents in its collections (shared ones included): their number, the
sum of their uploads' sizes and of their page counts, whatever their status (a failed
document keeps its upload until it is deleted).
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.errors import QuotaExceededError


@dataclass(frozen=True)
class Usage:
    """Bytes, documents and pages, as stored or as one upload adds them."""

    bytes: int = 0
    documents: int = 0
    pages: int = 0


@dataclass(frozen=True)
class Quota:
    """Per-tenant limits; 0 = unlimited."""

    bytes: int = 0
    documents: int = 0
    pages: int = 0
    collections: int = 0

    def check_collections(self, used: int) -> None:
        """Raise `QuotaExceededError` if one more collection passes the collections limit."""
        if self.collections and used + 1 > self.collections:
            raise QuotaExceededError("collections", self.collections, used, 1)

    def check(self, used: Usage, adding: Usage) -> None:
        """Raise `QuotaExceededError` naming the first limit that `used + adding` passes."""
        for name in ("bytes", "documents", "pages"):
            limit, now, more = getattr(self, name), getattr(used, name), getattr(adding, name)
            if limit and now + more > limit:
                raise QuotaExceededError(name, limit, now, more)
