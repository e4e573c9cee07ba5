"""Refresh policies: the seam the runtime calls (`policy_context`), how attention becomes token
scores (`scoring`, `selection`), one module per policy, and the registry (`registry`).

The registry's names are re-exported lazily (PEP 562), so that importing a helper module of
this package does not import every policy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conduit_core.policies.registry import (
        POLICIES,
        PolicyChoice,
        choose_policy,
        get_policy,
        register_policy,
    )

__all__ = ["POLICIES", "PolicyChoice", "choose_policy", "get_policy", "register_policy"]


def __getattr__(name: str) -> Any:
    """Import a registry name on first use."""
    if name not in __all__:
        raise AttributeError(f"module 'conduit_core.policies' has no attribute {name!r}")
    return getattr(importlib.import_module("conduit_core.policies.registry"), name)
