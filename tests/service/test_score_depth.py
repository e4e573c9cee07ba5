"""A request's scoring depth (`score_layers` as f in (0, 1]: the first ceil(f * L) decoder
layers, the scoring pass stopping there) is validated by the API and reaches the policy; a
deployment sets one with `CONDUIT_SCORE_LAYERS` ("0.6")."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from conduit_core.policies import choose_policy
from conduit_core.policies.choice import PolicyOptions
from service.schemas import QueryIn
from worker.policy_options import settle_policy
from worker.settings import Settings


@pytest.mark.parametrize("depth", [0.6, 1.0, 0.05])
def test_a_depth_is_taken_and_configures_the_policy(depth: float) -> None:
    body = QueryIn(collection_id="abc", question="What is due?", score_layers=depth)
    assert body.score_layers == depth
    choice = choose_policy("conduit_per_page", PolicyOptions(score_layers=body.score_layers))
    assert choice.options.score_layers == depth


@pytest.mark.parametrize("depth", [0.0, -0.2, 1.5])
def test_a_depth_outside_the_unit_interval_is_refused(depth: float) -> None:
    with pytest.raises(ValidationError, match="score_layers"):
        QueryIn(collection_id="abc", question="What is due?", score_layers=depth)


@pytest.mark.parametrize(("text", "want"), [("0.6", 0.6), (".25", 0.25), ("1", 1.0),
                                            ("all", "all"), ("1:3", (1, 3))])
def test_a_deployment_sets_a_depth(text: str, want: object) -> None:
    choice = settle_policy(Settings(score_layers=text), "conduit_per_page", PolicyOptions())
    assert choice.options.score_layers == want


@pytest.mark.parametrize("text", ["0", "0.0", "1.5", "-0.5", "first"])
def test_a_deployment_depth_outside_the_unit_interval_is_refused(text: str) -> None:
    with pytest.raises(ValidationError, match="score_layers"):
        Settings(score_layers=text)
