"""`conduit_no_amp`: CONDUIT without image-level amplification (gamma = 0, c_m = 1)."""

from __future__ import annotations

from conduit_core.policies.conduit import ConduitConfig, ConduitPolicy

select = ConduitPolicy(ConduitConfig(gamma=0.0), fixed=frozenset({"gamma"}))
