"""The refresh policies a deployment chooses from, resolved by name through one registry.

A policy maps a `PolicyContext` (see `conduit_core.policies.policy_context`) to the sequence
indices of the visual tokens to refresh. The registry holds the product's policies: the
default (`DEFAULT_POLICY`, `conduit_per_page`: CONDUIT with a per-page quota), `conduit_focus`
(the quota refreshing fewer tokens where the question's attention is concentrated), the
paper's `conduit`, the bounds `full_prefill`
and `full_reuse`, `prefix_reuse`, and the published baselines `cacheblend` and `epic`.
Ablations and candidates register themselves from the lab (`register_policy`), like any
configured variant (e.g. `ConduitPolicy(ConduitConfig(gamma=2))`).

A request's policy is chosen here once (`choose_policy`): the name looked up, the request's
options laid over the deployment's (`PolicyOptions.over`), and the policy configured with
them. Only the CONDUIT family (`ConduitPolicy`) takes options; a knob that defines a variant
(`conduit_per_page`'s and `conduit_focus`'s gamma) is never taken from the deployment and
refused from a request.
"""

from __future__ import annotations

from dataclasses import replace

from conduit_core.errors import InvalidRequestError, UnknownPolicyError
from conduit_core.policies import (
    cacheblend,
    conduit,
    conduit_focus,
    conduit_per_page,
    epic,
    full_prefill,
    full_reuse,
    prefix_reuse,
)
from conduit_core.policies.choice import DEFAULT_POLICY, PolicyChoice, PolicyOptions
from conduit_core.policies.conduit import ConduitPolicy
from conduit_core.policies.policy_context import RefreshPolicy

POLICIES: dict[str, RefreshPolicy] = {
    DEFAULT_POLICY: conduit_per_page.select,
    "conduit_focus": conduit_focus.select,
    "conduit": conduit.select,
    "full_prefill": full_prefill.select,
    "full_reuse": full_reuse.select,
    "prefix_reuse": prefix_reuse.select,
    "cacheblend": cacheblend.select,
    "epic": epic.select,
}
PRODUCT_POLICIES = frozenset(POLICIES)


def register_policy(name: str, policy: RefreshPolicy) -> None:
    """Add (or replace) a policy under `name`."""
    POLICIES[name] = policy


def choose_policy(name: str, requested: PolicyOptions | None = None,
                  deployment: PolicyOptions | None = None) -> PolicyChoice:
    """The policy registered under `name`, configured with the `requested` options over the
    `deployment`'s, kept with the name and the options it runs with: what a request carries
    down. The deployment's options apply to the CONDUIT family only, and never to a knob
    that defines the variant; a requested knob for another policy, a defining knob or a bad
    value raises `InvalidRequestError` (an unknown name `UnknownPolicyError`)."""
    requested = PolicyOptions() if requested is None else requested
    policy = get_policy(name)
    if not isinstance(policy, ConduitPolicy):
        if not requested.is_default():
            raise InvalidRequestError(f"policy {name!r} takes no options")
        return PolicyChoice(name, requested, policy)
    base = replace(deployment or PolicyOptions(), **dict.fromkeys(policy.fixed))
    options = requested.over(base)
    return PolicyChoice(name, options,
                        policy if options.is_default() else policy.with_options(options))


def get_policy(name: str) -> RefreshPolicy:
    """The policy registered under `name`."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown refresh policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
