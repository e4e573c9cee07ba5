"""No cross-request cache tells one tenant what another asked or uploaded (issue 60, point 1),
over real HTTP with three tenants' API keys.

The probe (on the default builtin model, whose pages are large enough that the policy
runs rather than its fallback): page labels (`[secret-plan.pdf p.1]`) and the prompt head are
computed once and cached, and what an answer computes is charged in `flops_ratio_lm`. Before
the caches were keyed by the page namespace, tenant B uploading a file named like one tenant
A has and asking got the warm figure on its very first answer (A had computed the label),
where a name nobody used gets the cold one: B learned that some tenant holds that file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.pdfs import text_pdf
from tests.service.conftest import start_server, stop_server, wait_ready

PAGES = ["Quarterly plan. The merger with Kessel closes in March.",
         "Budget annex. Legal fees are capped at two million.",
         "Staffing annex. The integration team has forty people."]
NAME = "secret-plan.pdf"
QUESTION = {"question": "When does the merger close?", "top_k": 1, "max_new_tokens": 2,
            "policy": "conduit_per_page", "budget": 0.1}
KEYS = ["alpha-key", "beta-key", "gamma-key"]


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[httpx.Client]]:
    home = tmp_path_factory.mktemp("tenant-cache")
    url, proc = start_server(home, {"CONDUIT_API_KEYS": json.dumps(KEYS), "CONDUIT_OCR": "false",
                                    "CONDUIT_MODEL": "builtin:small-qwen2-vl"})
    yield [httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {k}"})
           for k in KEYS]
    stop_server(proc)


def _upload(client: httpx.Client, name: str) -> str:
    col = client.post("/v1/collections", json={"name": "docs"}).json()["collection_id"]
    up = client.post(f"/v1/collections/{col}/documents",
                     files={"file": (name, text_pdf(PAGES), "application/pdf")})
    assert up.status_code == 202, up.text
    assert wait_ready(client, up.json()["document_id"])["status"] == "ready"
    return str(col)


def _ask(client: httpx.Client, col: str) -> dict:
    r = client.post("/v1/query", json={"collection_id": col, **QUESTION})
    assert r.status_code == 200, r.text
    body: dict = r.json()
    return body


def _observable(answer: dict) -> tuple:
    """What a tenant sees of an answer's cost and path (timings aside: shared load)."""
    return (answer["flops_ratio_lm"], answer["flops_ratio_total"], answer["fallback"],
            answer["refreshed_visual_tokens"], answer["cache"]["head_tokens"],
            tuple(c["attention"] for c in answer["citations"]))


def test_a_tenants_first_answer_never_sees_another_tenants_caches(
        clients: list[httpx.Client]) -> None:
    alpha, beta, gamma = clients
    a_col = _upload(alpha, NAME)
    a_first, a_again = _ask(alpha, a_col), _ask(alpha, a_col)
    # the probe is sensitive: within one tenant the second answer is cheaper (warm caches)
    assert a_again["flops_ratio_lm"] < a_first["flops_ratio_lm"]
    # B uploads a file of the same name and content and asks: its first answer is as cold as
    # A's was, not the warm figure A's activity would give it
    b_col = _upload(beta, NAME)
    b_first = _ask(beta, b_col)
    assert _observable(b_first) == _observable(a_first)
    assert _ask(beta, b_col)["flops_ratio_lm"] == a_again["flops_ratio_lm"]
    # a name nobody used, by a third tenant: the same cold figure again
    c_col = _upload(gamma, NAME.replace("secret", "public"))
    assert _ask(gamma, c_col)["flops_ratio_lm"] == pytest.approx(a_first["flops_ratio_lm"],
                                                                 rel=0.02)
