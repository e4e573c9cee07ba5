"""`conduit_adaptive`: CONDUIT with a budget chosen per question.

The paper's scores and amplification, then the fewest top tokens whose amplified scores hold
half of the score mass (`ConduitConfig.mass` = 0.5), never more than the request's budget:
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

from conduit_core.policies.conduit import ConduitConfig, ConduitPolicy

MASS = 0.5
select = ConduitPolicy(ConduitConfig(mass=MASS), fixed=frozenset())
