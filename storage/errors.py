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
