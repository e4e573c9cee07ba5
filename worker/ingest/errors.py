"""The ingestion branch of the worker's exception tree: every failure to read a document is an
`IngestError`, a `WorkerError` (`worker/errors.py`).

Each subclass carries a user-facing `.message` (safe to show in an API response: it never
contains paths or library internals) and an `http_status` hint for the service layer
(400 for a request the client can fix by sending a password, 422 for an unusable document).
"""

from __future__ import annotations

from worker.errors import WorkerError


class IngestError(WorkerError):
    """Base class: a document could not be ingested. `.message` is shown to the user."""

    http_status: int = 422


class EmptyFileError(IngestError):
    """The upload holds no bytes."""

    def __init__(self) -> None:
        super().__init__("The uploaded file is empty.")


class NotAPdfError(IngestError):
    """The bytes are not a PDF (no `%PDF-` header), whatever the file name says."""

    def __init__(self) -> None:
        super().__init__("The uploaded file is not a PDF document.")


class CorruptPdfError(IngestError):
    """The file starts like a PDF but cannot be read (truncated or damaged)."""

    def __init__(self, detail: str = "") -> None:
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"The PDF is damaged or truncated and cannot be read{suffix}.")


class PasswordRequiredError(IngestError):
    """The PDF is encrypted and no password was given."""

    http_status = 400

    def __init__(self) -> None:
        super().__init__("The PDF is password-protected: send its password to ingest it.")


class WrongPasswordError(IngestError):
    """The PDF is encrypted and the given password does not open it."""

    http_status = 400

    def __init__(self) -> None:
        super().__init__("The password does not open this PDF.")


class NoPagesError(IngestError):
    """The PDF opens but holds no pages."""

    def __init__(self) -> None:
        super().__init__("The PDF has no pages.")


class TooManyPagesError(IngestError):
    """The document (`what`: a PDF, or the pages an upload of another format became) has
    more pages than the configured limit."""

    def __init__(self, pages: int, max_pages: int, what: str = "PDF") -> None:
        super().__init__(f"The {what} has {pages} pages; at most {max_pages} are accepted.")
        self.pages = pages
        self.max_pages = max_pages


class UnreadableFileError(IngestError):
    """An upload of another format than PDF that its reader cannot read or convert."""

    def __init__(self, what: str, detail: str = "") -> None:
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"The {what} is damaged or cannot be read{suffix}.")


class ImageTooLargeError(IngestError):
    """An image whose decoded pixels would not fit a reader's memory (a decompression
    bomb), refused before it is decoded."""

    def __init__(self, width: int, height: int, cap: int) -> None:
        super().__init__(f"The image is {width} x {height} pixels; at most {cap} pixels are "
                         "accepted (a quarter of CONDUIT_PAGE_MEMORY_MB at 4 bytes a pixel).")


class IngestTimeoutError(IngestError):
    """Ingestion of one document ran past its deadline."""

    def __init__(self, seconds: float, pages_done: int, pages_total: int) -> None:
        super().__init__(
            f"Ingestion took longer than the {seconds:g} s limit "
            f"({pages_done} of {pages_total} pages done)."
        )
        self.seconds = seconds
        self.pages_done = pages_done
        self.pages_total = pages_total


class PageLimitError(IngestError):
    """Reading one page went past a limit of the sandboxed reader process (a content bomb:
    a small file whose page decompresses to gigabytes or takes minutes to draw)."""

    def __init__(self, message: str, page: int) -> None:
        super().__init__(message)
        self.page = page


class PageMemoryLimitError(PageLimitError):
    """A page needed more memory than the reader process may use."""

    def __init__(self, page: int, limit_mb: int, detail: str = "") -> None:
        suffix = f" ({detail})" if detail else ""
        super().__init__(
            f"Page {page} needs more than the {limit_mb} MiB memory limit for reading one page "
            f"(CONDUIT_PAGE_MEMORY_MB){suffix}.", page)
        self.limit_mb = limit_mb


class PageTimeLimitError(PageLimitError):
    """A page took longer to read than the per-page time limit; its reader was killed."""

    def __init__(self, page: int, seconds: float) -> None:
        super().__init__(
            f"Page {page} took longer than the {seconds:g} s time limit for reading one page "
            "(CONDUIT_PAGE_TIMEOUT_S); the reader was stopped.", page)
        self.seconds = seconds


class UnreadableDocumentError(IngestError):
    """No page of the document could be read."""

    def __init__(self, pages: int, first_reason: str) -> None:
        super().__init__(f"None of the {pages} pages could be read (page 1: {first_reason}).")


class ReaderStartError(IngestError):
    """A page reader process did not start in time (the machine is overloaded)."""

    http_status = 503

    def __init__(self, seconds: float) -> None:
        super().__init__(f"The PDF reader process did not start within {seconds:g} s (the "
                         "server is overloaded); upload the document again later.")


class ReaderBudgetError(IngestError):
    """The process's page readers hold their whole memory budget (`worker.ingest.budget`):
    no reader may start until one ends."""

    http_status = 503
    retry_after_s = 5

    def __init__(self, budget_mb: int, in_use_mb: int) -> None:
        super().__init__(
            f"The PDF readers are busy: {in_use_mb} of the {budget_mb} MiB they may use "
            "together (CONDUIT_READER_MEMORY_MB) are held by other documents; nothing was "
            "kept, upload the document again shortly.")
        self.budget_mb = budget_mb
        self.in_use_mb = in_use_mb


class OpenLimitError(IngestError):
    """Opening the PDF (its structure: cross-reference, object streams, page tree; before
    any page is drawn) went past a limit of the reader process: an object-stream bomb."""


class OpenMemoryLimitError(OpenLimitError):
    """Opening the PDF needed more memory than a reader process may use."""

    def __init__(self, limit_mb: int, detail: str = "") -> None:
        suffix = f" ({detail})" if detail else ""
        super().__init__(
            f"Opening the PDF needs more than the {limit_mb} MiB memory limit for reading a "
            f"document (CONDUIT_PAGE_MEMORY_MB){suffix}; the file was not accepted.")
        self.limit_mb = limit_mb


class OpenTimeLimitError(OpenLimitError):
    """Opening the PDF used more CPU time than a reader process may use for one step."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"Opening the PDF took more than the {seconds:g} s CPU-time limit for reading a "
            "document (CONDUIT_PAGE_TIMEOUT_S); the reader was stopped and the file was not "
            "accepted.")
        self.seconds = seconds


def rebuild_error(name: str, message: str) -> IngestError:
    """The `IngestError` a reader process reported by class `name` and `.message` (its own
    class when it is one of this module's, so callers still tell them apart)."""
    cls = globals().get(name)
    if not (isinstance(cls, type) and issubclass(cls, IngestError)):
        cls = IngestError
    exc: IngestError = cls.__new__(cls)
    IngestError.__init__(exc, message)
    return exc
