"""The depth candidates (`lab.testbed.depth`) are their rules with only the scored depth
changed, so that a probe compares scoring depths and nothing else."""

from __future__ import annotations

from dataclasses import replace

from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies import get_policy
from conduit_core.policies.conduit import ConduitPolicy
from lab.testbed.cheaper import CHEAPER
from lab.testbed.depth import depth_candidates


def test_each_candidate_is_its_rule_at_a_depth() -> None:
    got = depth_candidates()
    bases = {"depth": get_policy("conduit_per_page"), "page_knee": CHEAPER["cv_page_knee"],
             "adaptive": get_policy("conduit_adaptive")}
    depths = {n: (("08", 0.8), ("06", 0.6)) for n in bases} | {
        "depth": (("10", 1.0), ("08", 0.8), ("06", 0.6), ("04", 0.4))}
    assert set(got) == {f"cv_{n}_{tag}" for n in bases for tag, _ in depths[n]}
    for name, base in bases.items():
        assert isinstance(base, ConduitPolicy)
        for tag, depth in depths[name]:
            want = replace(base, config=replace(base.config, score=ScoreConfig(layers=depth)))
            assert got[f"cv_{name}_{tag}"] == want, name
            assert (got[f"cv_{name}_{tag}"] == base) == (base.config.score.layers == depth)
