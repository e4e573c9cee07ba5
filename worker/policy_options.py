"""The deployment's part in a request's policy: its CONDUIT knobs, read from the settings
once, under which a request's own knobs are laid (the rule itself, and which policies take
knobs at all, are the registry's: `conduit_core.policies.registry.choose_policy`).

Apart from the answer job so that code checking options (the policy suites, the CLI) imports
no pipeline: storage, retrieval and ingest stay out.
"""

from __future__ import annotations

from conduit_core.policies import PolicyChoice, choose_policy
from conduit_core.policies.choice import PolicyOptions
from worker.settings import Settings


def parse_layers(text: str | None) -> str | tuple[int, int] | float | None:
    """'all', 'start:stop' or a depth such as '0.6' (from settings or the CLI) as a
    `PolicyOptions.score_layers`."""
    if text is None or text == "all":
        return text
    if ":" not in text:
        return float(text)
    start, _, stop = text.partition(":")
    return int(start), int(stop)


def deployment_options(settings: Settings) -> PolicyOptions:
    """The deployment's CONDUIT knobs from settings (`CONDUIT_GAMMA`, ...)."""
    s = settings.core
    return PolicyOptions(gamma=s.gamma, score_layers=parse_layers(s.score_layers),
                         query_window=s.query_window, head_agg=s.head_agg)


def settle_policy(settings: Settings, name: str | None, requested: PolicyOptions
                  ) -> PolicyChoice:
    """The policy a request runs (`name`, else the deployment's) with the request's knobs
    over the deployment's, chosen once (raises `UnknownPolicyError`, `InvalidRequestError`)."""
    return choose_policy(name or settings.core.policy, requested,
                         deployment_options(settings))
