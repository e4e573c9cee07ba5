"""`conduit_per_page`, the product default, and the base of `conduit_focus` (which spends
less of its k where attention is concentrated): CONDUIT's
scores with a per-page quota instead of one global top-k (each page refreshes its
size-proportional share of k), scored over the first `DEPTH` of the decoder layers
(`ScoreConfig.layers` as a depth: the scoring pass stops after ceil(DEPTH * L) layers; a
request's or deployment's `score_layers` overrides it). A quota makes page amplification
irrelevant (a page's scores scaled by one factor keep their order within the page), so the
variant is defined with gamma = 0 and refuses a `gamma` option. Why this depth:
docs/DECISIONS.md ("The default scores 0.8 of the layers...")"""

from __future__ import annotations

from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies.conduit import ConduitConfig, ConduitPolicy

DEPTH = 0.8  # the share of the decoder layers the default scores with

select = ConduitPolicy(ConduitConfig(gamma=0.0, score=ScoreConfig(layers=DEPTH), per_page=True),
                       fixed=frozenset({"gamma"}))
