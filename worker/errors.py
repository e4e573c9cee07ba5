"""The exception tree of `worker` (ingest errors live in `worker.ingest.errors`)."""


class WorkerError(Exception):
    """Base class of pipeline errors that carry a user-facing message and an HTTP status."""

    http_status = 409

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NoPagesToAnswerError(WorkerError):
    """The scope of a question holds no ready pages."""


class UnknownPolicyError(WorkerError):
    """The request names a refresh policy the registry does not hold."""

    http_status = 422


class InvalidOptionsError(WorkerError):
    """The request's policy knobs are out of bounds or not taken by its policy."""

    http_status = 422
