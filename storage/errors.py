"""The exception tree of `storage`: every error it raises derives from `StorageError`."""


class StorageError(Exception):
    """Base class of all storage errors."""


class NotFoundError(StorageError):
    """A record that was asked for does not exist."""


class ConflictError(StorageError):
    """A record would violate a uniqueness rule (e.g. a collection name taken)."""


class CorruptEntryError(StorageError):
    """A stored entry failed its checksum or could not be decoded."""


class InvalidKeyError(StorageError):
    """A page hash is not a lowercase hex digest (it would be unsafe as a file or key name)."""


class UnavailableError(StorageError):
    """A backing service (e.g. Redis) could not be reached after retries."""


class DiskFullError(StorageError):
    """A write found no space left (ENOSPC, a quota of the filesystem, or SQLite's "database
    or disk is full"); nothing of the failed write was kept."""


class QuotaExceededError(StorageError):
    """A write would take a tenant past one of its quotas (`storage.metadata.usage.Quota`)."""

    def __init__(self, quota: str, limit: int, used: int, adding: int) -> None:
        what = quota if quota in ("collections", "conversations") else "documents"
        super().__init__(f"this tenant's quota of {limit} {quota} would be exceeded ({used} "
                         f"used, this request adds {adding}); delete {what} to make room")
        self.quota = quota
        self.limit = limit
        self.used = used
        self.adding = adding
