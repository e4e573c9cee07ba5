"""The exception tree of `conduit_core`: every error it raises derives from `ConduitCoreError`."""


class ConduitCoreError(Exception):
    """Base class of all conduit_core errors."""


class UnsupportedModelError(ConduitCoreError):
    """The checkpoint's architecture has no adapter."""


class FingerprintMismatch(ConduitCoreError):
    """A cached PageKV was produced by another model, dtype or template."""


class UnknownPolicyError(ConduitCoreError):
    """A request named a refresh policy that is not registered."""


class ModelLoadError(ConduitCoreError):
    """A model could not be read (missing folder, offline hub id, unreadable config)."""


class InvalidRequestError(ConduitCoreError, ValueError):
    """An answer request's parameters are out of range."""
