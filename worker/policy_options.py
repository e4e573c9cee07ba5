"""The knobs a policy runs with: the deployment's CONDUIT settings, a request's options over
them, and the knobs that define a variant (which neither may change).

Apart from the answer job so that code checking options (the policy suites, the CLI) imports
no pipeline: storage, retrieval and ingest stay out.
"""

from __future__ import annotations

from dataclasses import fields, replace

from conduit_core.answer_types import PolicyOptions
from conduit_core.policies import PolicyChoice, choose_policy, get_policy
from worker.settings import Settings


def parse_layers(text: str | None) -> str | tuple[int, int] | None:
    """'all' or 'start:stop' (from settings or the CLI) as a `PolicyOptions.score_layers`."""
    if text is None or text == "all":
        return text
    start, _, stop = text.partition(":")
    return int(start), int(stop)


def default_options(settings: Settings) -> PolicyOptions:
    """The deployment's CONDUIT knobs from settings."""
    return PolicyOptions(gamma=settings.gamma, score_layers=parse_layers(settings.score_layers),
                         query_window=settings.query_window, head_agg=settings.head_agg)


def merge_options(base: PolicyOptions, override: PolicyOptions) -> PolicyOptions:
    """`override`'s set knobs over `base`'s."""
    return PolicyOptions(**{f.name: getattr(override, f.name) if getattr(override, f.name)
                            is not None else getattr(base, f.name) for f in fields(base)})


def effective_options(settings: Settings, policy: str, requested: PolicyOptions
                      ) -> PolicyOptions:
    """The knobs `policy` runs with: the request's over the deployment's. The deployment's
    CONDUIT knobs apply only to policies that take options, and never to a knob that defines
    a variant (`conduit_no_amp` keeps gamma = 0 whatever `CONDUIT_GAMMA` says); a request
    that sets a knob for a policy without options, or a defining one, is refused."""
    chosen = get_policy(policy)
    if not hasattr(chosen, "with_options"):
        return requested
    fixed: frozenset[str] = getattr(chosen, "fixed", frozenset())
    base = replace(default_options(settings), **dict.fromkeys(fixed))
    return merge_options(base, requested)


def settle_policy(settings: Settings, name: str | None, requested: PolicyOptions
                  ) -> PolicyChoice:
    """The policy a request runs (`name`, else the deployment's) with its effective options,
    resolved once (raises `UnknownPolicyError`, `InvalidRequestError`)."""
    name = name or settings.policy
    return choose_policy(name, effective_options(settings, name, requested))
