"""The testbed task: documents, questions, shown pages, pixels, layouts, batch targets and
generated PDFs (no training)."""

import json
import random
import string

import numpy as np
import pymupdf
import pytest
import torch

from conduit_core.model.adapters.qwen2_vl import Qwen2VLAdapter
from conduit_core.model.testbed_model import MAX_IMAGE_TOKENS, build_testbed
from conduit_core.prompt.layout import build_layout
from lab.testbed.batches import (
    GlyphPatches,
    Layouts,
    Sample,
    draw_sample,
    make_batch,
    page_image,
    shown_pages,
)
from lab.testbed.generate import RENDER_DPI, SHOWN, generate
from lab.testbed.glyphs import ALPHABET, CELL, draw_grid
from lab.testbed.task import (
    FAMILIES,
    FILLER,
    LEGEND_CELL,
    PAGE,
    Document,
    Shape,
    make_document,
)
from worker.ingest.render import render_page
from worker.prompt import ANSWER_PREFIX
from worker.settings import Settings

SMALL = Shape(cols=16, rows=8, pages=(6, 6), shown=(4, 4))  # 128 cells a page: fast batches
_SPAN = {"lookup": 3, "reference": 3, "legend": 4, "split": 1}  # "5=K", "B=F", "3Q=G", "H"


@pytest.fixture(scope="module")
def parts():
    model, processor = build_testbed(weights=None)
    adapter = Qwen2VLAdapter(model, processor, processor.tokenizer, MAX_IMAGE_TOKENS)
    return adapter, GlyphPatches(processor), Layouts(adapter, SMALL)


def _documents():
    for shape, n in ((SMALL, 30), (PAGE, 10)):
        for seed in range(n):
            yield make_document(random.Random(seed), shape)


def _text_cells(doc: Document) -> set[tuple[int, int, int]]:
    """(page, row, col) of every cell written by the legend or a record (a split's value
    too); the rest is filler or blank."""
    cols, rows = doc.shape.cols, doc.shape.rows
    cells = {(0, 0, 0), (0, 0, LEGEND_CELL)}
    for r in doc.records:
        row, col = divmod(r.cell, cols)
        cells |= {(r.page, row, col - i) for i in range(_SPAN[r.family])}
        if r.family == "split":
            cells |= {(r.page - 1, rows - 1, 0), (r.page - 1, rows - 1, 1)}
    return cells


def test_documents_hold_every_family_on_full_pages():
    for doc in _documents():
        shape = doc.shape
        assert shape.pages[0] <= len(doc.pages) <= shape.pages[1]
        assert all(len(p) == shape.rows and all(len(line) == shape.cols for line in p)
                   for p in doc.pages)  # every page rows * cols cells
        assert sum(len(line) for line in doc.pages[0]) == shape.cells
        assert {r.family for r in doc.records} == set(FAMILIES) - {"pair"}
        keys = [r.key for r in doc.records]
        assert len(keys) == len(set(keys))
        for r in doc.records:  # the key cell holds the key's glyph
            assert doc.pages[r.page][r.cell // shape.cols][r.cell % shape.cols] == r.key
        rng = random.Random(0)
        assert {doc.question(f, rng).family for f in FAMILIES} == set(FAMILIES)


def test_records_resolve_as_their_family_says():
    columns = set()
    for doc in _documents():
        columns.add(doc.legend_column)
        cols, rows = doc.shape.cols, doc.shape.rows
        by_key = {r.key: r for r in doc.records}
        assert doc.pages[0][0][:2] == f"#{doc.legend_column}"
        for r in doc.records:
            row, col = divmod(r.cell, cols)
            line = doc.pages[r.page][row]
            if r.family == "lookup":  # "5=K"
                assert line[col - 2:col + 1] == f"{r.answer}={r.key}"
                assert r.evidence_pages == (r.page + 1,) and doc.source(r) is None
            elif r.family == "reference":  # "B=F": F has B's value, B an earlier lookup
                named = by_key[line[col - 2]]
                assert line[col - 1] == "=" and named.family == "lookup"
                assert named.page < r.page and r.answer == named.answer
                assert r.evidence_pages == (named.page + 1, r.page + 1)
                assert doc.source(r) == (named.page, named.cell)
            elif r.family == "legend":  # "3Q=G": "#1" names the digit, "#2" the letter
                digit, letter = line[col - 3], line[col - 2]
                assert digit.isdigit() and letter.isalpha() and letter not in by_key
                assert line[col - 1] == "=" and r.page > 0
                assert r.answer == (digit if doc.legend_column == 1 else letter)
                assert r.evidence_pages == (1, r.page + 1)
                assert doc.source(r) == (0, LEGEND_CELL)
                assert doc.pages[0][0][LEGEND_CELL] == str(doc.legend_column)
            else:  # split: "7=" ends the page before, the key opens this one
                assert r.cell == 0 and r.page >= 2
                assert doc.pages[r.page - 1][rows - 1][:2] == f"{r.answer}="
                assert r.evidence_pages == (r.page, r.page + 1)
                page, cell = doc.source(r)  # type: ignore[misc]
                assert (page, cell) == (r.page - 1, (rows - 1) * cols)
                assert doc.pages[page][cell // cols][cell % cols] == r.answer
    assert columns == {1, 2}  # legends naming the digit and legends naming the letter


def test_filler_holds_no_letter_and_no_equals_sign():
    filled = 0
    for doc in _documents():
        text = _text_cells(doc)
        for p, page in enumerate(doc.pages):
            for row, line in enumerate(page):
                for col, ch in enumerate(line):
                    if (p, row, col) not in text:
                        assert ch in FILLER + " ", (p, row, col, ch)
                        filled += ch != " "
    assert filled > 0


def test_aux_targets_need_every_evidence_page():
    for doc in _documents():
        for page in range(len(doc.pages)):
            assert doc.aux_targets(page) == sorted(
                (r.cell, r.answer) for r in doc.records if r.page == page)
            alone = {r.cell for r in doc.records if r.page == page and r.family == "lookup"}
            assert {c for c, _ in doc.aux_targets(page, [page])} == alone  # the rest need more


def test_questions_ask_one_record_or_a_pair_on_two_pages():
    for doc in _documents():
        rng = random.Random(1)
        for family in FAMILIES:
            q = doc.question(family, rng)
            if family == "pair":
                a, b = q.records
                assert a.family == b.family == "lookup" and a.page < b.page
                assert q.text == f"What are {a.key} and {b.key}?"
                assert q.answer == f"{a.answer} {b.answer}"
                assert q.evidence_pages == (a.page + 1, b.page + 1)
            else:
                (r,) = q.records
                assert r.family == family and q.text == f"What is {r.key}?"
                assert q.answer == r.answer and q.evidence_pages == r.evidence_pages


def test_samples_show_the_evidence_and_distractors_in_document_order():
    rng = random.Random(2)
    for shape in (SMALL, PAGE):
        for _ in range(40):
            s = draw_sample(rng, shape)
            needed = s.question.evidence_indices
            assert needed <= set(s.pages) and s.pages == sorted(set(s.pages))
            assert shape.shown[0] <= len(s.pages) <= shape.shown[1]
            assert s.text == s.question.text and s.question.family in FAMILIES
    for k in (1, 2, 3, 6, 9):
        s = draw_sample(rng, SMALL, shown=k)
        needed = s.question.evidence_indices
        assert needed <= set(s.pages) and s.pages == sorted(s.pages)
        assert len(s.pages) == max(len(needed), min(k, len(s.doc.pages)))
    doc = make_document(random.Random(3), SMALL)
    for seed in range(10):
        pages = shown_pages(doc, {4, 1}, 4, random.Random(seed))
        assert len(pages) == 4 and {1, 4} <= set(pages) and pages == sorted(pages)
    assert shown_pages(doc, {4, 1}, 1, random.Random(0)) == [1, 4]
    assert shown_pages(doc, {0}, 99, random.Random(0)) == list(range(len(doc.pages)))


def test_a_page_is_256_visual_tokens_of_the_glyph_table(parts):
    adapter, patches, _ = parts
    rows = make_document(random.Random(3)).pages[1]
    prepared = adapter.prepare_pages([page_image(rows)])[0]
    assert prepared.image_grid.tolist() == [1, 2 * PAGE.rows, 2 * PAGE.cols] == [1, 32, 32]
    assert int(prepared.image_grid.prod()) // 4 == PAGE.cells == MAX_IMAGE_TOKENS == 256
    assert torch.equal(prepared.vision_inputs["pixel_values"], patches.page_pixels(rows))


def test_layouts_match_the_runtime_layout(parts):
    adapter, _, layouts = parts
    rng = random.Random(0)
    families = set()
    for _ in range(20):
        s = draw_sample(rng, SMALL)
        families.add(s.question.family)
        ids, pos, starts, nxt = layouts.layout(s)
        ref = build_layout(adapter, ANSWER_PREFIX, s.labels(), [layouts.segment] * len(s.pages),
                           [layouts.grid] * len(s.pages), s.text)
        assert torch.equal(ids, ref.token_ids) and torch.equal(pos, ref.position_ids)
        assert starts == [seg.start for seg in ref.segments] and nxt == ref.next_position()
    assert "pair" in families


def _one_of_each(shape: Shape) -> list[Sample]:
    """A sample of each family, over its evidence plus distractors (shown[0] pages in all)."""
    rng = random.Random(5)
    out = []
    for family in FAMILIES:
        doc = make_document(rng, shape)
        q = doc.question(family, rng)
        pages = shown_pages(doc, q.evidence_indices, shape.shown[0], rng)
        out.append(Sample(doc, q, pages, f"t{len(out):03d}.pdf"))
    return out


def test_batch_targets_point_at_the_right_tokens(parts):
    adapter, patches, layouts = parts
    samples = _one_of_each(SMALL)
    batch = make_batch(samples, layouts, patches)
    tok, image_id = adapter.tokenizer, adapter.image_token_id
    cols = SMALL.cols
    starts = [dict(zip(s.pages, layouts.layout(s)[2], strict=True)) for s in samples]

    def at(b: int, page: int, cell: int) -> int:
        return starts[b][page] + 1 + cell  # sequence index of a page cell

    # every cell names its glyph: pages x cells targets, all on image tokens
    assert len(batch.glyphs) == sum(len(s.pages) for s in samples) * SMALL.cells
    glyph_at = {(b, i): t for b, i, t in batch.glyphs.tolist()}
    for (b, i), t in glyph_at.items():
        assert batch.ids[b, i] == image_id and tok.decode([t]) in ALPHABET
    for b, s in enumerate(samples):
        for p in s.pages:
            assert all(glyph_at[(b, at(b, p, c))] == layouts.token_of(ch)
                       for c, ch in enumerate("".join(s.doc.pages[p])))
    # the answer, one token per character ("5 7" for a pair), then the end of the turn
    assert len(batch.answer) == len(batch.answer_end)
    for b, s in enumerate(samples):
        rows = batch.answer[batch.answer[:, 0] == b]
        ends = batch.answer_end[batch.answer[:, 0] == b]
        assert ends.tolist() == [False] * len(s.question.answer) + [True]
        assert tok.decode(rows[~ends, 2].tolist()) == s.question.answer
        assert tok.convert_ids_to_tokens(int(rows[-1, 2])) == "<|im_end|>"
        idx = rows[:, 1].tolist()
        assert idx == list(range(idx[0], idx[0] + len(idx)))
        assert batch.ids[b, [i + 1 for i in idx[:-1]]].tolist() == rows[:-1, 2].tolist()
    assert samples[-1].question.family == "pair" and " " in samples[-1].question.answer
    # the question's key tokens and answer positions look at the asked key cells
    for b, s in enumerate(samples):
        looks = batch.look_q[batch.look_q[:, 0] == b].tolist()
        want = [at(b, r.page, r.cell) for r in s.question.records]
        assert [cell for _, _, cell in looks] == want + want
        answer_rows = batch.answer[batch.answer[:, 0] == b, 1].tolist()
        assert [i for _, i, _ in looks[len(want):]] == answer_rows[0:2 * len(want):2]
        for (_, i, cell), r in zip(looks, list(s.question.records) * 2, strict=True):
            assert glyph_at[(b, cell)] == layouts.token_of(r.key) and cell < i
    # each question's key token names the asked value
    for b, s in enumerate(samples):
        asks = batch.ask[batch.ask[:, 0] == b].tolist()
        for (_, i, value), r in zip(asks, s.question.records, strict=True):
            assert tok.decode(batch.ids[b, i:i + 1]).strip() == r.key
            assert tok.decode([value]) == r.answer
    # resolved values on key cells whose evidence is shown; looks at the cell each one reads
    aux = {(b, i): t for b, i, t in batch.aux.tolist()}
    looks_p = {(b, i): cell for b, i, cell in batch.look_p.tolist()}
    held = {(b, i): t for b, i, t in batch.held.tolist()}
    for b, s in enumerate(samples):
        shown = set(s.pages)
        for r in s.doc.records:
            if r.page not in shown:
                continue
            key = (b, at(b, r.page, r.cell))
            complete = all(p - 1 in shown for p in r.evidence_pages)
            assert (key in aux) == complete and (not complete or
                                                 tok.decode([aux[key]]) == r.answer)
            src = s.doc.source(r)
            assert (key in looks_p) == (src is not None and src[0] in shown)
            if key in looks_p:
                assert looks_p[key] == at(b, *src) < key[1]  # type: ignore[misc]
            row = s.doc.pages[r.page][r.cell // cols]
            want = {"lookup": r.answer, "legend": row[r.cell % cols - 2]}.get(r.family)
            assert held.get(key) == (None if want is None else layouts.token_of(want))
    assert len(aux) == sum(len(s.doc.aux_targets(p, s.pages))
                           for s in samples for p in s.pages)
    assert all(batch.ids[b, i] == image_id for b, i in [*aux, *looks_p, *held])
    assert {tok.decode([t]) for t in aux.values()} <= set(string.digits + string.ascii_uppercase)


def test_follow_up_turns_ask_answerable_records(parts):
    adapter, patches, layouts = parts
    s = draw_sample(random.Random(1), SMALL, follow_ups=3)
    assert len(s.follow_ups) == 3
    assert all(q.records[0] not in s.question.records for q in s.follow_ups)
    assert all(p - 1 in s.pages for q in s.follow_ups for p in q.evidence_pages)
    batch = make_batch([s], layouts, patches)
    tok = adapter.tokenizer
    for (_, i, digit), q in zip(batch.follow[0::2].tolist(), s.follow_ups, strict=True):
        assert tok.decode([digit]) == q.answer and batch.ids[0, i + 1] == digit
        assert tok.decode(batch.ids[0, i - 15:i + 1]).endswith(
            f"{q.text}<|im_end|>\n<|im_start|>assistant\n")
    n_first = len(s.question.records)
    for (_, i, digit), q in zip(batch.ask[n_first:].tolist(), s.follow_ups, strict=True):
        assert tok.decode(batch.ids[0, i - 3:i + 2]).endswith(q.text)
        assert tok.decode([digit]) == q.answer
    pos = batch.position_ids[:, 0]  # (3, N): the turns continue the text positions
    n = int(batch.answer[-1, 1])
    assert torch.equal(pos[0, n:], torch.arange(pos[0, n], pos[0, n] + pos.shape[1] - n))


def test_generated_pdfs_render_to_the_training_pixels(tmp_path, parts):
    adapter = parts[0]
    rows = generate(tmp_path, 7, seed=4)
    assert len(rows) == 7 and {r["family"] for r in rows} == set(FAMILIES)
    assert [r["doc"] for r in rows] == ["t000.pdf"] * 5 + ["t001.pdf"] * 2
    lines = [json.loads(x) for x in (tmp_path / "questions.jsonl").read_text().splitlines()]
    assert lines == rows
    doc = make_document(random.Random("generate:4:0"))
    for r in rows:
        answer = str(r["answer"])
        assert r["answer_format"] == ("Int" if len(answer) == 1 and answer.isdigit() else "Str")
        shown, evidence = list(r["shown_pages"]), list(r["evidence_pages"])
        assert set(evidence) <= set(shown) and shown == sorted(set(shown))
        if r["doc"] == "t000.pdf":
            assert len(shown) == min(SHOWN, len(doc.pages))
    pair = next(r for r in rows if r["family"] == "pair")
    assert str(pair["question"]).startswith("What are ") and " " in str(pair["answer"])
    assert Settings().worker.render_dpi == RENDER_DPI
    pdf = pymupdf.open(tmp_path / "pdfs" / "t000.pdf")
    assert pdf.page_count == len(doc.pages)
    for i, page_rows in enumerate(doc.pages):
        img = render_page(pdf, i, dpi=RENDER_DPI, max_pixels=10**7)
        assert img.size == (PAGE.cols * CELL, PAGE.rows * CELL) == (448, 448)
        assert np.array_equal(np.asarray(img), draw_grid(page_rows))
        record = next(line.strip() for line in page_rows if "=" in line)
        assert record in pdf[i].get_text()  # the invisible text layer
    grid = adapter.prepare_pages([render_page(pdf, 0, dpi=RENDER_DPI, max_pixels=10**7)])[0]
    assert grid.image_grid.tolist() == [1, 32, 32]  # 256 visual tokens a page
    with pytest.raises(ValueError):
        generate(tmp_path / "big", 5001, seed=1)


def test_pair_share_draws_the_pair_family_that_often_and_leaves_the_recipe_alone() -> None:
    shape = SMALL
    recipe = [draw_sample(random.Random(f"s{i}"), shape).question.family for i in range(10)]
    again = [draw_sample(random.Random(f"s{i}"), shape, pair_share=None).question.family
             for i in range(10)]
    assert recipe == again  # the default keeps the recipe's random stream
    drawn = [draw_sample(random.Random(f"p{i}"), shape, pair_share=0.6).question.family
             for i in range(200)]
    assert 0.5 < drawn.count("pair") / 200 < 0.7
    assert {f for f in drawn if f != "pair"} == {"reference", "split", "legend", "lookup"}
    assert all(draw_sample(random.Random(i), shape, pair_share=1.0).question.family == "pair"
               for i in range(5))
    with pytest.raises(ValueError, match="pair_share"):
        draw_sample(random.Random(0), shape, pair_share=1.5)
