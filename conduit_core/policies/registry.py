"""The refresh policies a deployment chooses from, resolved by name through one registry.

A policy maps a `PolicyContext` (see `conduit_core.policies.policy_context`) to the sequence
indices of the visual tokens to refresh. The registry holds the product's policies: the
default (`DEFAULT_POLICY`, CONDUIT with a per-page quota), the paper's `conduit`, the bounds
`full_prefill` and `full_reuse`, `prefix_reuse`, and the published baselines `cacheblend` and
`epic`. Ablations and candidates register themselves from the lab (`register_policy`), like
any configured variant (e.g. `ConduitPolicy(ConduitConfig(gamma=2))`).

Public API:
  DEFAULT_POLICY = "conduit_per_page"     (`conduit_core.answer_types`)
  PRODUCT_POLICIES: frozenset[str]       the names above
  POLICIES: dict[str, RefreshPolicy]     the product's, plus any registered since
  register_policy(name, policy) -> None
  get_policy(name) -> RefreshPolicy      raises UnknownPolicyError listing the known names
  resolve_policy(name, options) -> RefreshPolicy   the policy configured by `PolicyOptions`
  choose_policy(name, options) -> PolicyChoice     the same, with the name and options it
                                   was resolved from (`conduit_core.answer_types`): what a
                                   request carries down
"""

from __future__ import annotations

from conduit_core.answer_types import DEFAULT_POLICY, PolicyChoice, PolicyOptions
from conduit_core.errors import InvalidRequestError, UnknownPolicyError
from conduit_core.policies import (
    cacheblend,
    conduit,
    conduit_per_page,
    epic,
    full_prefill,
    full_reuse,
    prefix_reuse,
)
from conduit_core.policies.policy_context import RefreshPolicy

POLICIES: dict[str, RefreshPolicy] = {
    DEFAULT_POLICY: conduit_per_page.select,
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


def choose_policy(name: str, options: PolicyOptions) -> PolicyChoice:
    """`resolve_policy` kept with what it resolved (raises as it does)."""
    return PolicyChoice(name, options, resolve_policy(name, options))


def get_policy(name: str) -> RefreshPolicy:
    """The policy registered under `name`."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown refresh policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
