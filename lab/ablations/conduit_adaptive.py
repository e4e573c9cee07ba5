"""`conduit_adaptive`: CONDUIT with a budget chosen per question.

The paper's scores and amplification, then the fewest top tokens whose amplified scores hold
half of the score mass (`AdaptiveConduitPolicy.mass` = 0.5), never more than the request's budget:
the budget is the cap on the refresh and on its FLOPs. Where the question's attention is
concentrated (the trained testbed: the asked record's key cell alone holds much of it) it
refreshes a few percent of the page tokens; where it is spread (random weights, diffuse
attention) the cap binds and it is CONDUIT at that budget. Its cost is predicted at the share
of the cap it refreshed in earlier answers at the same budget (at the cap with none:
`conduit_core.cost.choice_history`); whether to fall back is decided at the cap. On the page-scale
testbed (lab/testbed/NOTES.md) it equalled full prefill on the development seed and kept 96% of
its answers on the final one, at 0.13 of its LM FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from conduit_core.policies.conduit import ConduitChoice, ConduitPolicy
from conduit_core.policies.conduit_focus import mass_count
from conduit_core.policies.policy_context import PolicyContext

MASS = 0.5


@dataclass(frozen=True)
class AdaptiveConduitPolicy(ConduitPolicy):
    """CONDUIT refreshing the fewest top tokens that hold `mass` of the amplified score mass,
    at most the request's k (the cap). The k is read back from the scores: a host sync the
    product's CONDUIT never makes."""

    mass: float = MASS

    def __post_init__(self) -> None:
        if not 0.0 < self.mass <= 1.0:
            raise ValueError(f"mass must be in (0, 1], got {self.mass}")

    def explain(self, ctx: PolicyContext) -> ConduitChoice:
        """Score and amplify as CONDUIT, then take the mass's k (at most the request's)."""
        rows, amplified, c = self.amplified(ctx)
        m = mass_count(amplified.float().cpu().numpy(), self.mass, ctx.k)  # the host read
        pos = self.positions(ctx, amplified, m)
        return ConduitChoice(rows=rows[pos], scores=amplified, amplification=c)


select = AdaptiveConduitPolicy()
