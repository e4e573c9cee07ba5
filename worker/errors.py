"""The exception tree of `worker` (ingest errors live in `worker.ingest.errors`)."""


class WorkerError(Exception):
    """Base class of pipeline errors that carry a user-facing message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NoPagesToAnswerError(WorkerError):
    """The scope of a question holds no ready pages."""
