"""The exception tree of `worker` (ingest errors live in `worker.ingest.errors`)."""


class WorkerError(Exception):
    """Base class of pipeline errors that carry a user-facing message and an HTTP status."""

    http_status = 409

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NoPagesToAnswerError(WorkerError):
    """The scope of a question holds no ready pages."""


class InvalidOptionsError(WorkerError):
    """The request's refresh policy or its knobs: a policy the registry does not hold
    (conduit_core's `UnknownPolicyError` is the core's name for it), or knobs out of bounds or
    not taken by the policy."""

    http_status = 422


class AnswerQueueFullError(WorkerError):
    """No answer slot freed within the queue wait (or the engine is stopping): retry later."""

    http_status = 503
    retry_after_s = 5


class AnswerTooLargeError(WorkerError):
    """One question needs more KV cache positions than the engine holds at once."""

    http_status = 422


class AnswerCancelledError(WorkerError):
    """The question's client went away; its answer left the batch."""

    http_status = 499
