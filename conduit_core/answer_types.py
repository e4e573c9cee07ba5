"""The runtime's seam to the worker: what a question over cached pages asks
(`AnswerRequest`, its pages as `PageInput`, the earlier turns of its conversation as `Turn`)
and what its answer reports (`AnswerResult`).

A request is validated on construction (`InvalidRequestError`) and carries its refresh policy
already chosen (`conduit_core.policies.choice.PolicyChoice`: the name, the options it runs
with and the configured policy), so that nothing after it resolves a policy again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NewType

from conduit_core.errors import InvalidRequestError
from conduit_core.policies.choice import DEFAULT_POLICY, PolicyChoice
from conduit_core.policies.registry import choose_policy

if TYPE_CHECKING:
    from conduit_core.page_kv import PageKV

TokenId = NewType("TokenId", int)
TokenCallback = Callable[[TokenId, str], None]


@dataclass(frozen=True)
class PageInput:
    """A cached page to place in the assembled prompt, preceded by `label` text."""

    label: str
    kv: PageKV
    page_id: str = ""  # the page's identity in a conversation's key (its storage hash);
    # empty: a digest of its embeddings stands for it


@dataclass(frozen=True)
class Turn:
    """An answered turn of a conversation: the pages it added (after the pages of the turns
    before it), its question and its answer's text."""

    pages: tuple[PageInput, ...]
    question: str
    answer: str


@dataclass(frozen=True)
class AnswerRequest:
    """One question over cached pages, with the refresh policy chosen for it (the default
    policy, unconfigured, when none is given)."""

    prefix: str
    pages: list[PageInput]
    question: str
    policy: PolicyChoice = field(default_factory=lambda: choose_policy(DEFAULT_POLICY))
    budget: float = 0.1  # fraction of visual tokens the policy may refresh
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    # the pages' namespace (a tenant, or the shared corpus): every cache the answer reads or
    # fills across requests (prompt head, page labels, choice history) is keyed by it, so
    # that nothing an answer reports depends on another namespace's questions
    namespace: str = ""
    # the conversation's answered turns, oldest first: `pages` are the pages this turn adds
    # and the layout is the conversation's (`conduit_core.prompt.conversation`); its prefix
    # comes from the conversation cache, or is rebuilt (`conduit_core.conversation`)
    history: tuple[Turn, ...] = ()
    keep: bool = False  # keep this turn, with its answer, as a prefix for a follow-up
    # whose conversation it is: the conversation cache is kept per this name (`namespace`
    # when empty), so that tenants sharing pages never share a conversation
    tenant: str = ""

    def __post_init__(self) -> None:
        if not 0.0 <= self.budget <= 1.0:
            raise InvalidRequestError(f"budget must be in [0, 1], got {self.budget}")
        if self.max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0.0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class AnswerResult:
    """The generated answer with timing, refresh and FLOPs accounting.

    Two FLOPs ratios, both over a full prefill of the same layout: `flops_ratio_lm` counts the
    language model only (the prefill work reuse saves; the paper's figure is of this kind) and
    is the headline; `flops_ratio_total` also counts the vision tower, which a full prefill
    runs and reuse of cached page embeddings never does.
    """

    text: str
    token_ids: list[TokenId]
    ttft_s: float  # request start to the first generated token, measured in the runtime
    total_s: float
    refreshed_visual_tokens: int
    visual_tokens: int
    flops_full_lm: float  # language-model FLOPs of a full prefill of the same layout
    flops_vision: float  # vision-tower FLOPs of encoding the layout's pages
    flops_used_lm: float  # language-model FLOPs this answer's prefill spent (scoring included)
    flops_used_vision: float  # vision-tower FLOPs it spent (0 when page embeddings are cached)
    policy: str = ""
    prompt_tokens: int = 0
    stop_reason: str = field(default="length")  # "stop" (a stop token) or "length"
    head_tokens: int = 0  # leading prompt tokens exact from the head cache (charged only in
    # the answer that computed them: `fill_flops_lm`)
    fallback: bool = False  # the policy was predicted to cost more than a full prefill from
    # the cached page embeddings, which ran instead (`conduit_core.cost.cost_model`)
    fill_flops_lm: float = 0.0  # of flops_used_lm: the head and page labels this answer
    # computed because their caches missed (0 on warm caches; they never decide the path)
    predicted_flops_lm: float = 0.0  # the policy's LM FLOPs as predicted before it ran
    fallback_flops_lm: float = 0.0  # a full prefill from cached embeddings, as predicted
    # how much the question looked at each page in the scoring pass (request order; its
    # peak attention, normalised to sum to 1: `Assembly.page_attention`); empty when no
    # scoring pass ran (a policy without one, or a fallback)
    page_attention: tuple[float, ...] = ()
    # a follow-up's prefix: "hit" (from the conversation cache), "rebuilt" (its earlier turns
    # recomputed from their text and pages, charged in fill_flops_lm), "" (not a follow-up)
    conversation: str = ""
    kept_flops_lm: float = 0.0  # with `keep`: the answer's rows computed after it to keep
    # the turn as a prefix (decode-time work, outside flops_used_lm)

    @property
    def flops_full(self) -> float:
        """FLOPs of a full prefill, vision tower included."""
        return self.flops_full_lm + self.flops_vision

    @property
    def flops_used(self) -> float:
        """FLOPs this answer's prefill spent, vision tower included."""
        return self.flops_used_lm + self.flops_used_vision

    @property
    def flops_ratio_lm(self) -> float:
        """Language-model FLOPs spent over a full prefill's (vision excluded on both sides)."""
        return self.flops_used_lm / self.flops_full_lm if self.flops_full_lm else 0.0

    @property
    def flops_ratio_total(self) -> float:
        """All prefill FLOPs spent over a full prefill's, vision tower included."""
        return self.flops_used / self.flops_full if self.flops_full else 0.0
