"""Refresh policies, one file each, resolved by name through one registry.

A policy maps a `PolicyContext` (see `conduit_core.policies.policy_context`) to the sequence
indices of the visual tokens to refresh. Adding one: a module here with a `select` callable,
and its line in `POLICIES`. Configured variants (e.g. `ConduitPolicy(ConduitConfig(gamma=2))`)
can be added at run time with `register_policy`.

Public API:
  POLICIES: dict[str, RefreshPolicy]     "full_prefill", "full_reuse", ...
  register_policy(name, policy) -> None
  get_policy(name) -> RefreshPolicy      raises UnknownPolicyError listing the known names
  resolve_policy(name, options) -> RefreshPolicy   the policy configured by `PolicyOptions`
"""

from __future__ import annotations

from conduit_core.answer_types import PolicyOptions
from conduit_core.errors import InvalidRequestError, UnknownPolicyError
from conduit_core.policies import (
    cacheblend,
    conduit,
    conduit_adaptive,
    conduit_no_amp,
    conduit_per_page,
    epic,
    full_prefill,
    full_reuse,
    prefix_reuse,
    random,
    raw_attention,
    value_norm,
)
from conduit_core.policies.policy_context import RefreshPolicy

POLICIES: dict[str, RefreshPolicy] = {
    "full_prefill": full_prefill.select,
    "full_reuse": full_reuse.select,
    "prefix_reuse": prefix_reuse.select,
    "random": random.select,
    "raw_attention": raw_attention.select,
    "value_norm": value_norm.select,
    "cacheblend": cacheblend.select,
    "epic": epic.select,
    "epic_proportional": epic.proportional,
    "conduit": conduit.select,
    "conduit_adaptive": conduit_adaptive.select,
    "conduit_no_amp": conduit_no_amp.select,
    "conduit_per_page": conduit_per_page.select,
}


def register_policy(name: str, policy: RefreshPolicy) -> None:
    """Add (or replace) a policy under `name`."""
    POLICIES[name] = policy


def resolve_policy(name: str, options: PolicyOptions) -> RefreshPolicy:
    """The policy registered under `name`, configured with `options` when any is set.

    Only policies with a `with_options(options)` method (the CONDUIT family) take options;
    setting one for another policy raises `InvalidRequestError`.
    """
    policy = get_policy(name)
    if options.is_default():
        return policy
    configure = getattr(policy, "with_options", None)
    if configure is None:
        raise InvalidRequestError(f"policy {name!r} takes no options")
    configured: RefreshPolicy = configure(options)
    return configured


def get_policy(name: str) -> RefreshPolicy:
    """The policy registered under `name`."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown refresh policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
