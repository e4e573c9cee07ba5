"""The lab's policies: registered by importing `lab.ablations`, never part of the product's
registry (issue 59: the product carries what a deployer chooses)."""

from __future__ import annotations

import subprocess
import sys

import torch

from conduit_core.policies import POLICIES
from conduit_core.policies.registry import PRODUCT_POLICIES
from lab.ablations import ABLATIONS
from lab.ablations.raw_attention import pool_within_pages


def test_the_product_registry_holds_what_a_deployer_chooses() -> None:
    """In a process that never imported the lab, the registry is the product's policies."""
    code = ("from conduit_core.policies import POLICIES; "
            "print(','.join(sorted(POLICIES)))")
    names = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                           text=True).stdout.strip().split(",")
    assert set(names) == PRODUCT_POLICIES and len(names) <= 8
    assert {"conduit_focus", "conduit_per_page", "conduit", "full_prefill", "full_reuse",
            "prefix_reuse", "cacheblend", "epic"} == PRODUCT_POLICIES
    assert not PRODUCT_POLICIES & set(ABLATIONS)


def test_importing_the_lab_registers_its_ablations() -> None:
    assert all(POLICIES[name] is policy for name, policy in ABLATIONS.items())


def test_pooling_stays_inside_pages() -> None:
    page_of = torch.tensor([0, 0, 0, 1, 1])
    scores = torch.tensor([0.0, 0.0, 5.0, 0.0, 1.0])
    assert pool_within_pages(scores, page_of, 3, "max").tolist() == [0.0, 5.0, 5.0, 1.0, 1.0]
    avg = pool_within_pages(scores, page_of, 3, "avg")
    assert torch.allclose(avg, torch.tensor([0.0, 5 / 3, 2.5, 0.5, 0.5]))
    assert torch.equal(pool_within_pages(scores, page_of, 1), scores)
