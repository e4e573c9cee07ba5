"""The trained testbed weights (conduit_core/weights/, committed: a missing file fails): they
load as a builtin, answer what they learned, and stale page KV costs the answers that CONDUIT's
refresh recovers (docs/TESTBED.md)."""

import pymupdf

from conduit_core.loader import load_vlm
from conduit_core.runtime import ReuseRuntime
from conduit_core.testbed_model import WEIGHTS
from lab.testbed.generate import RENDER_DPI, generate
from lab.testbed.probe import load_checkpoint_vlm, probe
from worker.answer_job import ANSWER_PREFIX, page_label
from worker.ingest.render import render_page


def test_the_weights_are_in_the_tree():
    assert WEIGHTS.is_file(), f"{WEIGHTS} is missing: it is committed (docs/TESTBED.md)"
    assert WEIGHTS.stat().st_size < 20 * 2**20


def test_full_prefill_answers_generated_questions(tmp_path):
    vlm = load_vlm("builtin:testbed-qwen2-vl", cache_dir=tmp_path / "models")
    assert vlm.adapter.max_image_tokens == 36
    runtime = ReuseRuntime(vlm)
    questions = generate(tmp_path / "set", 50, seed=123)  # a seed training never drew from
    hits: dict[str, list[bool]] = {}
    for q in questions:
        pdf = pymupdf.open(tmp_path / "set" / "pdfs" / str(q["doc"]))
        pages = [(page_label(str(q["doc"]), p),
                  render_page(pdf, p - 1, dpi=RENDER_DPI, max_pixels=10**6))
                 for p in q["evidence_pages"]]
        result = runtime.answer_full_prefill(ANSWER_PREFIX, pages, str(q["question"]),
                                             max_new_tokens=3)
        hits.setdefault(str(q["family"]), []).append(result.text.strip() == q["answer"])
    overall = sum(sum(h) for h in hits.values()) / len(questions)
    assert overall >= 0.85, hits


def test_stale_page_kv_loses_cross_page_answers_and_conduit_recovers_them():
    rows = probe(load_checkpoint_vlm(WEIGHTS), n=100,  # the probe's default seed
                 policies=("full_reuse", "conduit", "epic"), budgets=(0.1,))
    acc = {(r["family"], r["policy"]): r["accuracy"] for r in rows}
    for family in ("reference", "split"):
        assert acc[(family, "full_prefill")] >= 0.9
        assert acc[(family, "full_reuse")] <= 0.3  # the key cell's stale KV lacks the value
        assert acc[(family, "conduit")] >= 0.9  # refreshing 10% of the page tokens restores it
    # a legend record without its legend falls back to the digit; the refresh re-reads page 1
    assert acc[("legend", "full_reuse")] <= acc[("legend", "full_prefill")] - 0.3
    assert acc[("legend", "conduit")] >= acc[("legend", "full_reuse")] + 0.3
    # EPIC refreshes each page's first tokens: a reference's key cell sits in any row
    assert acc[("reference", "epic")] <= 0.5
    assert min(acc[("lookup", p)] for p in ("full_prefill", "full_reuse", "conduit")) >= 0.9
