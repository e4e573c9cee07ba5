"""Refresh policies, one file each, resolved by name through one registry.

A policy maps a `PolicyContext` (see `conduit_core.policy_context`) to the sequence indices of
the visual tokens to refresh.

Public API:
  POLICIES: dict[str, RefreshPolicy]     "full_prefill", "full_reuse", ...
  register_policy(name, policy) -> None
  get_policy(name) -> RefreshPolicy      raises UnknownPolicyError listing the known names
"""

from __future__ import annotations

from conduit_core.errors import UnknownPolicyError
from conduit_core.policies import full_prefill, full_reuse
from conduit_core.policy_context import RefreshPolicy

POLICIES: dict[str, RefreshPolicy] = {
    "full_prefill": full_prefill.select,
    "full_reuse": full_reuse.select,
}


def register_policy(name: str, policy: RefreshPolicy) -> None:
    """Add (or replace) a policy under `name`."""
    POLICIES[name] = policy


def get_policy(name: str) -> RefreshPolicy:
    """The policy registered under `name`."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(
            f"unknown refresh policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
