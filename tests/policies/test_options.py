"""Per-request CONDUIT knobs (`PolicyOptions`): they change the choice, are validated, are
refused by policies that have no knobs, and lie over the deployment's in one place
(`choose_policy`)."""

from __future__ import annotations

import inspect
from typing import get_args

import pytest

from conduit_core import ReuseRuntime
from conduit_core.answer_types import AnswerRequest
from conduit_core.errors import InvalidRequestError
from conduit_core.policies import choose_policy, get_policy
from conduit_core.policies.choice import PolicyOptions
from conduit_core.policies.conduit import ConduitPolicy
from conduit_core.policies.conduit_focus import BOUNDARY, FocusPolicy
from conduit_core.prompt.layout import LABEL_REFRESH
from lab.refresh_probe import probe_refresh
from tests.policies.conftest import CachedPages
from worker.policy_options import settle_policy
from worker.settings import CoreSettings, Settings

LABELS = ["[a p.1]", "[a p.2]", "[b p.1]"]


def _request(cached: CachedPages, options: PolicyOptions,
             policy: str = "conduit") -> AnswerRequest:
    return AnswerRequest(prefix="Another prefix entirely.", pages=cached.inputs(LABELS),
                         question="Which page mentions the valve?",
                         policy=choose_policy(policy, options), budget=0.3, max_new_tokens=1)


def test_default_options_resolve_to_the_registered_policy() -> None:
    assert choose_policy("conduit", PolicyOptions()).select is get_policy("conduit")
    assert choose_policy("conduit") == choose_policy("conduit", PolicyOptions())


def test_options_configure_the_conduit_family() -> None:
    p = choose_policy("conduit_per_page", PolicyOptions(score_layers=(1, 2), query_window=3,
                                                        head_agg="max")).select
    assert isinstance(p, ConduitPolicy)
    assert p.config.per_page and p.config.gamma == 0.0
    assert p.config.score.layers == (1, 2)
    assert p.config.score.query_window == 3 and p.config.score.head_agg == "max"


def test_knobs_change_the_choice_but_not_the_budget(cached: CachedPages) -> None:
    base = probe_refresh(cached.runtime, _request(cached, PolicyOptions()))
    other = probe_refresh(cached.runtime, _request(cached, PolicyOptions(
        head_agg="max", query_window=1, score_layers=(1, 2), gamma=4.0)))
    n_visual = sum(kv.num_tokens for kv in cached.kvs)
    assert base.visual_rows.numel() == other.visual_rows.numel() == round(0.3 * n_visual)
    assert set(base.visual_rows.tolist()) != set(other.visual_rows.tolist())


@pytest.mark.parametrize("options", [PolicyOptions(head_agg="median"),
                                     PolicyOptions(gamma=-1.0),
                                     PolicyOptions(query_window=0)])
def test_bad_knobs_are_refused(options: PolicyOptions) -> None:
    with pytest.raises(InvalidRequestError):
        choose_policy("conduit", options)


def test_policies_without_knobs_refuse_options() -> None:
    with pytest.raises(InvalidRequestError, match="takes no options"):
        choose_policy("random", PolicyOptions(gamma=1.0))


def test_deployment_knobs_apply_only_to_policies_that_take_options() -> None:
    settings = Settings(gamma=2.0, head_agg="max")
    plain = settle_policy(settings, "full_prefill", PolicyOptions())  # CONDUIT_GAMMA is no knob
    assert plain.options.is_default() and plain.select is get_policy("full_prefill")
    conduit = settle_policy(settings, "conduit", PolicyOptions(query_window=4)).options
    assert (conduit.gamma, conduit.head_agg, conduit.query_window) == (2.0, "max", 4)
    with pytest.raises(InvalidRequestError):  # the request itself set a knob it cannot take
        settle_policy(settings, "random", PolicyOptions(gamma=3.0))
    assert settle_policy(settings, None, PolicyOptions()).name == settings.core.policy


def test_ablations_keep_their_defining_knobs() -> None:
    """CONDUIT_GAMMA must not turn `conduit_no_amp` back into CONDUIT, nor set a gamma on
    `conduit_per_page` (the service's default) or `conduit_focus`, where quotas make it
    meaningless."""
    settings = Settings(gamma=2.0, head_agg="max")
    no_amp = settle_policy(settings, "conduit_no_amp", PolicyOptions())
    assert no_amp.options.gamma is None and no_amp.options.head_agg == "max"  # the others apply
    assert no_amp.select.config.gamma == 0.0  # type: ignore[attr-defined]
    with pytest.raises(InvalidRequestError, match="gamma"):
        choose_policy("conduit_no_amp", PolicyOptions(gamma=1.0))
    per_page = settle_policy(settings, "conduit_per_page", PolicyOptions()).select
    assert per_page.config.per_page and per_page.config.gamma == 0.0  # type: ignore[attr-defined]
    assert per_page.config.score.head_agg == "max"  # type: ignore[attr-defined]
    with pytest.raises(InvalidRequestError, match="gamma"):
        choose_policy("conduit_per_page", PolicyOptions(gamma=1.0))
    focus = settle_policy(settings, "conduit_focus", PolicyOptions()).select
    assert isinstance(focus, FocusPolicy) and focus.boundary == BOUNDARY  # its own rule kept
    assert focus.config.gamma == 0.0 and focus.config.score.head_agg == "max"
    with pytest.raises(InvalidRequestError, match="gamma"):
        choose_policy("conduit_focus", PolicyOptions(gamma=1.0))


def test_the_runtime_defaults_are_the_services() -> None:
    """Lab benches build a `ReuseRuntime` with its defaults: they measure what the service
    runs only while those equal the service's settings."""
    defaults = {name: p.default for name, p in
                inspect.signature(ReuseRuntime.__init__).parameters.items()}
    s = Settings()
    assert defaults["head_cache"] == s.core.head_cache
    assert defaults["label_cache"] == s.core.label_cache
    assert defaults["label_entries"] == s.core.label_cache_entries
    assert defaults["label_refresh"] == s.core.label_refresh
    assert get_args(CoreSettings.model_fields["label_refresh"].annotation) == LABEL_REFRESH
    assert defaults["never_above_full"] == s.core.never_above_full
