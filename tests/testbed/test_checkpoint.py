"""The trained testbed checkpoint: it loads as a builtin and still answers what it learned.

The current checkpoint did not reach the issue's bar (85% here): it answers the split family
and some lookups, not the content-matching families (docs/TESTBED.md). This test pins the
level it reached, so a change to loading, layout or rendering that breaks it fails."""

import pymupdf
import pytest

from conduit_core.loader import load_vlm
from conduit_core.runtime import ReuseRuntime
from conduit_core.testbed_model import WEIGHTS
from testbed.generate import RENDER_DPI, generate
from worker.answer_job import ANSWER_PREFIX, page_label
from worker.ingest.render import render_page

pytestmark = pytest.mark.skipif(
    not WEIGHTS.is_file(),
    reason="no trained testbed weights in conduit_core/weights/ "
    "(not in git until one meets its bar)")


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
    assert sum(hits["split"]) / len(hits["split"]) >= 0.9
    assert overall >= 0.3
