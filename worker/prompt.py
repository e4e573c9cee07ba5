"""The service's prompt text: the fixed answer instructions every question is asked under (the
prompt head the runtime caches) and the label placed before each page (and cited with it).

Kept apart from the answer job so that code that lays prompts out as the service does (the
testbed's training and probes, the benches) imports these two names without the pipeline:
storage, retrieval and ingest (PDF and OCR libraries) stay out of a training process.
"""

from __future__ import annotations

ANSWER_PREFIX = (
    "You answer questions about the document pages shown. Answer briefly and cite pages "
    "by their labels."
)


def page_label(filename: str, number: int) -> str:
    """The text placed before a page in the assembled prompt (and cited with it)."""
    return f"[{filename} p.{number}]"
