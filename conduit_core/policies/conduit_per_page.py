"""`conduit_per_page`: CONDUIT's scores with a per-page quota instead of one global top-k
(each page refreshes its size-proportional share of k; amplification then has no effect)."""

from __future__ import annotations

from conduit_core.policies.conduit import ConduitConfig, ConduitPolicy

select = ConduitPolicy(ConduitConfig(per_page=True))
