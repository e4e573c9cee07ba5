"""Pydantic schemas of every request and response body of the REST API.

Every string and list a request carries is bounded (length, and for ids a pattern): input past
a bound is a 422 naming the field, never a 500 and never an unbounded allocation.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# conduit's ids are `col_`, `doc_` or `job_` and 20 hex digits (`storage.metadata.new_id`)
ApiId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
MAX_SCOPE_DOCUMENTS = 1000
MAX_LAYER = 1024


class CollectionIn(BaseModel):
    """Create a collection."""

    name: str = Field(..., min_length=1, max_length=200, pattern=r"^[\w .\-]+$")
    shared: bool = Field(False, description=(
        "Share cached page KV across tenants (a page any tenant already uploaded is not "
        "prefilled again). Trade-off: by timing, a tenant can learn whether a page it guesses "
        "is already cached by someone. Use it for public corpora only."))


class CollectionOut(BaseModel):
    """A collection."""

    collection_id: str
    name: str
    shared: bool
    created_at: float


class SkippedPageOut(BaseModel):
    """A page that could not be read."""

    page: int = Field(description="1-based page number.")
    reason: str


class DocumentOut(BaseModel):
    """A document and its ingestion progress."""

    document_id: str
    collection_id: str
    filename: str
    sha256: str
    size_bytes: int = Field(description="What the document takes on disk and is charged to "
                            "the byte quota: its upload until it is ready, then with its page "
                            "images, page KV and text.")
    status: str
    stage: str
    pages_done: int
    pages_total: int
    error: str | None
    job_id: str | None
    skipped_pages: list[SkippedPageOut] = Field(
        default_factory=list, description="Pages of a ready document that could not be read "
        "(damaged or missing from the file) and were left out, with the reason.")
    warning: str | None = Field(None, description="Set when the document is ready but some "
                                "pages could not be read.")


class UploadOut(BaseModel):
    """Reply to an accepted upload (HTTP 202)."""

    document_id: str
    job_id: str
    status: str


class JobOut(BaseModel):
    """A background job."""

    job_id: str
    kind: str
    status: str
    document_id: str | None
    error: str | None


def _has_words(question: str) -> str:
    """A question must hold a letter or a digit (whitespace or punctuation alone asks nothing)."""
    if not any(ch.isalnum() for ch in question):
        raise ValueError("the question has no letter or digit")
    return question


Question = Annotated[str, Field(min_length=1, max_length=4000), AfterValidator(_has_words)]


class QueryIn(BaseModel):
    """A question over a collection, or over some of its documents.

    `question` is also capped in model tokens (`CONDUIT_MAX_QUESTION_TOKENS`, 422 naming the
    limit) and must hold a letter or a digit (422 otherwise); NaN and Infinity are refused in
    every number (422, not a 500 at encoding time).
    """

    model_config = ConfigDict(allow_inf_nan=False)

    collection_id: ApiId
    question: Question
    top_k: int = Field(3, ge=1, le=32)
    max_new_tokens: int = Field(64, ge=1, le=2048)
    document_ids: list[ApiId] | None = Field(
        None, max_length=MAX_SCOPE_DOCUMENTS,
        description="Restrict to these documents of the collection (404 naming an id that is "
        "not one of them).")
    policy: str | None = Field(None, max_length=64,
                               description="Refresh policy; default from settings.")
    budget: float | None = Field(None, ge=0.0, le=1.0, description="Refresh budget.")
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    gamma: float | None = Field(None, ge=0.0, le=100.0,
                                description="CONDUIT amplification exponent.")
    score_layers: Literal["all"] | tuple[Annotated[int, Field(ge=0, le=MAX_LAYER)],
                                         Annotated[int, Field(ge=0, le=MAX_LAYER)]] | Annotated[
        float, Field(gt=0.0, le=1.0)] | None = Field(
        None, description="'all', a [start, stop) pair of decoder layers CONDUIT scores with, "
        "or a depth f in (0, 1]: the first ceil(f * L) layers (the scoring pass stops there); "
        "unset = the deployment's, else the policy's own: 'all' for conduit, 0.8 for "
        "conduit_per_page.")
    query_window: int | None = Field(None, ge=1, le=65536,
                                     description="Score with the last w question tokens.")
    head_agg: Literal["mean", "max"] | None = Field(None, description="Head aggregation.")
    bm25_weight: float | None = Field(None, ge=0.0, le=1000.0,
                                      description="RRF weight of BM25.")
    dense_weight: float | None = Field(None, ge=0.0, le=1000.0,
                                       description="RRF weight of dense.")


class SnippetOut(BaseModel):
    """The passage of a cited page's text (text layer or OCR) that best matches the question."""

    text: str = Field(description="At most a few hundred characters, whitespace collapsed.")
    spans: list[tuple[int, int]] = Field(description="[start, end) character offsets in `text` "
                                         "of the words that match a question term.")
    clipped_left: bool = Field(description="The page text goes on before the passage.")
    clipped_right: bool = Field(description="The page text goes on after the passage.")


class CitationOut(BaseModel):
    """A page the answer used."""

    document_id: str
    filename: str
    page: int
    score: float
    snippet: SnippetOut | None = None
    attention: float | None = Field(None, description="How much the question looked at the "
                                    "page: its most attended token in the scoring pass, "
                                    "normalised over the answer's pages (they sum to 1); "
                                    "null when the policy ran no scoring pass.")


class CacheOut(BaseModel):
    """Where the answer's page KV came from, over distinct pages."""

    pages_from: dict[str, int] = Field(description="Pages read from each KV tier (memory, "
                                       "redis, disk), by the tier that served them.")
    pages_prefilled_now: int = Field(description="Pages not in any tier, prefilled for this "
                                     "question.")
    head_tokens: int = Field(0, description="Leading prompt tokens (chat template and answer "
                             "instructions) reused exactly from the prompt-head cache.")
    conversation: Literal["", "hit", "rebuilt"] = Field(
        "", description="A follow-up's earlier turns: 'hit' when their KV was kept from the "
        "turn before, 'rebuilt' when it was recomputed from their text and pages; '' for a "
        "first question.")


class PageOut(BaseModel):
    """One page of a ready document."""

    number: int = Field(description="1-based page number.")
    width: int = Field(description="Rendered image width in pixels.")
    height: int = Field(description="Rendered image height in pixels.")
    kv_cached: bool = Field(description="Whether the page's KV is stored in any tier.")
    kv_tiers: list[str] = Field(description="The tiers holding the page's KV, fastest first.")
    text_chars: int = Field(description="Length of the page's text (text layer or OCR).")
    ocr: bool = Field(description="Whether the text was read by OCR.")


class QueryOut(BaseModel):
    """An answer with citations, timings and compute."""

    answer: str
    citations: list[CitationOut]
    policy: str
    budget: float
    flops_ratio_lm: float = Field(description="Language-model prefill FLOPs spent over a full "
                                  "prefill's (vision tower excluded on both sides).")
    flops_ratio_total: float = Field(description="Prefill FLOPs spent over a full prefill's, "
                                     "vision tower included (reuse never runs it).")
    refreshed_visual_tokens: int
    visual_tokens: int
    timings: dict[str, float]
    cache: CacheOut
    fallback: bool = Field(False, description="The policy was predicted to cost more than a "
                           "full prefill from the cached page embeddings, so that ran instead "
                           "(every visual token recomputed; the answer is full prefill's).")
    dropped_turns: int = Field(0, description="A follow-up's oldest turns left out to keep "
                               "the conversation within its bounds.")


class ConversationIn(BaseModel):
    """Start a conversation over a collection, or over some of its documents."""

    collection_id: ApiId
    document_ids: list[ApiId] | None = Field(
        None, max_length=MAX_SCOPE_DOCUMENTS,
        description="Restrict its turns to these documents of the collection.")
    title: str = Field("", max_length=200, description="A name to list it by.")


class MessageIn(BaseModel):
    """The next question of a conversation (`QueryIn`'s fields but its scope)."""

    model_config = ConfigDict(allow_inf_nan=False)

    question: Question
    top_k: int = Field(3, ge=1, le=32)
    max_new_tokens: int = Field(64, ge=1, le=2048)
    policy: str | None = Field(None, max_length=64,
                               description="Refresh policy; default from settings.")
    budget: float | None = Field(None, ge=0.0, le=1.0, description="Refresh budget.")
    temperature: float = Field(0.0, ge=0.0, le=2.0)


class TurnOut(BaseModel):
    """One answered turn of a conversation."""

    question: str
    answer: str
    citations: list[dict[str, object]]
    details: dict[str, object] = Field(description="The answer's figures: policy, budget, "
                                       "FLOPs ratios, timings, cache (`QueryOut`'s).")
    created_at: float


class ConversationOut(BaseModel):
    """A conversation; its turns when read alone (`GET /v1/conversations/{id}`)."""

    conversation_id: str
    collection_id: str
    document_ids: list[str] | None
    title: str
    created_at: float
    updated_at: float
    turns: list[TurnOut] | None = Field(None, description="Oldest first; null in a list.")
