"""Typed request/result dataclasses at the runtime seam (used by the worker layer).

Public API:
  PageInput(label: str, kv: PageKV)             one retrieved page and the text placed before it
  PolicyChoice(name, options, select)           a refresh policy resolved for one request
  DEFAULT_POLICY = "conduit_per_page"
  AnswerRequest(prefix, pages, question, policy=DEFAULT_POLICY, budget=0.1, max_new_tokens=64,
                temperature=0.0, top_p=1.0, seed=None, options=PolicyOptions(),
                namespace="")   validated: InvalidRequestError, UnknownPolicyError
    .policy: a registered name, resolved with `options` on construction, or a
        `PolicyChoice` resolved where the request entered; either way .choice after it
  AnswerResult(text, token_ids, ttft_s, total_s, refreshed_visual_tokens, visual_tokens,
               flops_full_lm, flops_vision, flops_used_lm, flops_used_vision, policy,
               prompt_tokens, stop_reason, head_tokens, fallback, fill_flops_lm,
               predicted_flops_lm, fallback_flops_lm, page_attention)
    .flops_ratio_lm     language model only: flops_used_lm / flops_full_lm (the headline)
    .flops_ratio_total  vision tower included: flops_used / flops_full
    .flops_full, .flops_used   LM + vision sums
    .own_flops_lm       flops_used_lm less fill_flops_lm (the path's own work, warm caches)
  TokenId = NewType("TokenId", int)             a vocabulary id
  TokenCallback = Callable[[TokenId, str], None]  called once per generated token (id, piece)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NewType

from conduit_core.errors import InvalidRequestError

if TYPE_CHECKING:  # torch stays unimported for the settings (DEFAULT_POLICY)
    from conduit_core.page_kv import PageKV
    from conduit_core.policies.policy_context import RefreshPolicy

TokenId = NewType("TokenId", int)
DEFAULT_POLICY = "conduit_per_page"  # the refresh policy of a request that names none
TokenCallback = Callable[[TokenId, str], None]


@dataclass(frozen=True)
class PageInput:
    """A cached page to place in the assembled prompt, preceded by `label` text."""

    label: str
    kv: PageKV


@dataclass(frozen=True)
class PolicyOptions:
    """Per-request knobs of the CONDUIT family (`conduit`, `conduit_per_page`).

    Every field None = the registered policy's own value. See
    `conduit_core.passes.scoring.ScoreConfig` and `conduit_core.policies.conduit.ConduitConfig`
    for meanings and bounds.
    gamma:         amplification exponent >= 0 (0 = no image-level amplification).
    score_layers:  "all" or a half-open (start, stop) range of decoder layers to score with.
    query_window:  score with only the last w question tokens (None = all of them).
    head_agg:      "mean" or "max" over query heads.
    """

    gamma: float | None = None
    score_layers: str | tuple[int, int] | None = None
    query_window: int | None = None
    head_agg: str | None = None

    def is_default(self) -> bool:
        """True when no knob is set."""
        return all(v is None for v in (self.gamma, self.score_layers, self.query_window,
                                       self.head_agg))


@dataclass(frozen=True)
class PolicyChoice:
    """A refresh policy resolved once for a request (`conduit_core.policies.registry.
    choose_policy`): the registered name, the options it was configured with, and the
    configured policy. Equal choices run the same selection."""

    name: str
    options: PolicyOptions
    select: RefreshPolicy = field(compare=False, repr=False)


@dataclass(frozen=True)
class AnswerRequest:
    """One question over cached pages. `policy` names a refresh policy in the registry
    (`conduit_core.policies.registry`), configured by `options`, or is the `PolicyChoice`
    resolved where the request entered (its options then are the request's); the request
    is resolved once, here, and every later step reads `choice`."""

    prefix: str
    pages: list[PageInput]
    question: str
    policy: str | PolicyChoice = DEFAULT_POLICY
    budget: float = 0.1  # fraction of visual tokens the policy may refresh
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    options: PolicyOptions = field(default_factory=PolicyOptions)
    # the pages' namespace (a tenant, or the shared corpus): every cache the answer reads or
    # fills across requests (prompt head, page labels, choice history) is keyed by it, so
    # that nothing an answer reports depends on another namespace's questions
    namespace: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.policy, str):
            from conduit_core.policies.registry import choose_policy  # the registry imports this

            object.__setattr__(self, "policy", choose_policy(self.policy, self.options))
        elif not self.options.is_default() and self.options != self.choice.options:
            raise InvalidRequestError("options are given with the policy's choice, not apart")
        object.__setattr__(self, "options", self.choice.options)
        if not 0.0 <= self.budget <= 1.0:
            raise InvalidRequestError(f"budget must be in [0, 1], got {self.budget}")
        if self.max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0.0:
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def choice(self) -> PolicyChoice:
        """The resolved policy (a name given is resolved on construction)."""
        assert not isinstance(self.policy, str)
        return self.policy


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

    @property
    def own_flops_lm(self) -> float:
        """The LM FLOPs of the answer's own path (`flops_used_lm` less its cache fills): what
        the cost model predicts and the fallback guard bounds; the same on cold and warm
        caches."""
        return self.flops_used_lm - self.fill_flops_lm

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
