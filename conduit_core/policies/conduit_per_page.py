"""`conduit_per_page`: CONDUIT's scores with a per-page quota instead of one global top-k
(each page refreshes its size-proportional share of k). A quota makes page amplification
irrelevant (a page's scores scaled by one factor keep their order within the page), so the
variant is defined with gamma = 0 and refuses a `gamma` option."""

from __future__ import annotations

from conduit_core.policies.conduit import ConduitConfig, ConduitPolicy

select = ConduitPolicy(ConduitConfig(gamma=0.0, per_page=True), fixed=frozenset({"gamma"}))
