"""The lab's refresh policies: ablations of CONDUIT and baselines no deployment chooses.

Importing this package registers them in the product's registry
(`conduit_core.policies.register_policy`), beside the product's own policies, for this
process: `random`, `raw_attention`, `value_norm`, `conduit_no_amp`, `conduit_adaptive` and
`epic_proportional`. A lab module that resolves any of them by name imports it.
"""

from __future__ import annotations

from conduit_core.policies import register_policy
from conduit_core.policies.epic import EpicPolicy
from conduit_core.policies.policy_context import RefreshPolicy
from lab.ablations import conduit_adaptive, conduit_no_amp, random, raw_attention, value_norm

ABLATIONS: dict[str, RefreshPolicy] = {
    "random": random.select,
    "raw_attention": raw_attention.select,
    "value_norm": value_norm.select,
    "conduit_no_amp": conduit_no_amp.select,
    "conduit_adaptive": conduit_adaptive.select,
    "epic_proportional": EpicPolicy(split="size"),
}

for _name, _policy in ABLATIONS.items():
    register_policy(_name, _policy)
