"""The testbed task: documents, pixels, layouts and generated PDFs (no training)."""

import json
import random
import string

import numpy as np
import pymupdf
import pytest
import torch

from conduit_core.adapters.qwen2_vl import Qwen2VLAdapter
from conduit_core.layout import build_layout
from conduit_core.testbed_model import MAX_IMAGE_TOKENS, build_testbed
from lab.testbed.batches import GlyphPatches, Layouts, draw_sample, make_batch, page_image
from lab.testbed.generate import RENDER_DPI, generate
from lab.testbed.glyphs import ALPHABET, draw_grid
from lab.testbed.task import COLS, FAMILIES, ROWS, make_document
from worker.answer_job import ANSWER_PREFIX
from worker.ingest.render import render_page
from worker.settings import Settings


@pytest.fixture(scope="module")
def parts():
    model, processor = build_testbed(weights=None)
    adapter = Qwen2VLAdapter(model, processor, processor.tokenizer, MAX_IMAGE_TOKENS)
    return adapter, GlyphPatches(processor), Layouts(adapter)


def test_documents_resolve_every_family():
    for seed in range(50):
        doc = make_document(random.Random(seed))
        assert {r.family for r in doc.records} == set(FAMILIES)
        keys = [r.key for r in doc.records]
        assert len(keys) == len(set(keys))
        cells = {r.key: (r.page, r.cell) for r in doc.records}
        values = {r.key: r.answer for r in doc.records}
        legend = int(doc.pages[0][0][1])
        for r in doc.records:
            row = doc.pages[r.page][r.cell // COLS]
            assert all(len(line) == COLS for line in doc.pages[r.page])
            assert row[r.cell % COLS] == r.key  # the key cell is the result cell
            if r.family == "reference":  # "B=F": F has the value of B, an earlier record
                ref = row[0]
                assert row.strip() == f"{ref}={r.key}" and r.answer == values[ref]
                assert cells[ref][0] < r.page and r.evidence_pages[-1] == r.page + 1
            elif r.family == "legend":  # "3Q=G": a digit, a letter that is no key
                assert r.answer == row[legend - 1] and r.evidence_pages[0] == 1
                assert row[0].isdigit() and row[1].isalpha() and row[1] not in cells
            elif r.family == "split":  # the value ends one page, its key opens the next
                assert r.cell == 0 and row.strip() == r.key
                assert doc.pages[r.page - 1][-1].strip() == f"{r.answer}="
            else:
                assert row.strip() == f"{r.answer}={r.key}"
        for page in range(len(doc.pages)):
            assert doc.aux_targets(page) == sorted(
                (r.cell, r.answer) for r in doc.records if r.page == page)
            alone = {r.cell for r in doc.records if r.page == page and r.family == "lookup"}
            assert {c for c, _ in doc.aux_targets(page, [page])} == alone  # the rest need more


def test_glyph_table_is_the_processor_output(parts):
    adapter, patches, _ = parts
    rows = make_document(random.Random(3)).pages[1]
    prepared = adapter.prepare_pages([page_image(rows)])[0]
    assert prepared.image_grid.tolist() == [1, 2 * ROWS, 2 * COLS]
    assert torch.equal(prepared.vision_inputs["pixel_values"], patches.page_pixels(rows))


def test_layouts_match_the_runtime_layout(parts):
    adapter, _, layouts = parts
    rng = random.Random(0)
    for _ in range(20):
        s = draw_sample(rng)
        ids, pos, starts, nxt = layouts.layout(s)
        ref = build_layout(adapter, ANSWER_PREFIX, s.labels(), [layouts.segment] * len(s.pages),
                           [layouts.grid] * len(s.pages), s.question)
        assert torch.equal(ids, ref.token_ids) and torch.equal(pos, ref.position_ids)
        assert starts == [seg.start for seg in ref.segments] and nxt == ref.next_position()


def test_batch_targets_point_at_the_right_tokens(parts):
    adapter, patches, layouts = parts
    samples = [draw_sample(random.Random(i)) for i in range(4)]
    batch = make_batch(samples, layouts, patches)
    tok = adapter.tokenizer
    image_id = adapter.image_token_id
    for b, row, target in batch.aux.tolist():
        assert batch.ids[b, row] == image_id
        assert tok.decode([target]) in string.digits + string.ascii_uppercase
    assert len(batch.glyphs) == sum(len(s.pages) for s in samples) * ROWS * COLS
    for b, row, target in batch.glyphs.tolist():
        assert batch.ids[b, row] == image_id
        assert tok.decode([target]) in ALPHABET
    for i, s in enumerate(samples):
        (_, r1, digit), (_, r2, end) = batch.answer[2 * i:2 * i + 2].tolist()
        assert tok.decode([digit]) == s.record.answer
        assert batch.ids[i, r2] == digit and r2 == r1 + 1
        assert tok.convert_ids_to_tokens(end) == "<|im_end|>"
    glyph_at = {(b, i): t for b, i, t in batch.glyphs.tolist()}
    assert len(batch.look_q) == 2 * len(samples)  # the key token and the answer position
    for (b, at, cell), s in zip(batch.look_q.tolist(), [s for s in samples for _ in "qa"],
                                strict=True):
        assert glyph_at[(b, cell)] == layouts.token_of(s.record.key) and at < batch.answer[
            2 * b, 1] + 1
    looks = batch.look_p.tolist()
    assert looks and {(b, at) for b, at, _ in looks} <= {(b, at) for b, at, _ in batch.aux.tolist()}
    for b, at, cell in looks:  # a key cell -> the cell on another page it needs
        s = samples[b]
        key = next(r for r in s.doc.records if layouts.token_of(r.key) == glyph_at[(b, at)])
        page, src = s.doc.source(key)  # type: ignore[misc]
        want = {"reference": s.doc.pages[key.page][key.cell // COLS][0],
                "legend": s.doc.pages[0][0][1], "split": f"{key.answer}"}[key.family]
        assert glyph_at[(b, cell)] == layouts.token_of(want) and cell < at and page < key.page
    assert len(batch.held)
    families = set()
    for b, at, value in batch.held.tolist():  # a lookup's key cell holds its own value, a
        key = next(r for r in samples[b].doc.records  # legend record's its row's letter
                   if layouts.token_of(r.key) == glyph_at[(b, at)])
        row = samples[b].doc.pages[key.page][key.cell // COLS]
        want = key.answer if key.family == "lookup" else row[1]
        assert key.family in ("lookup", "legend") and tok.decode([value]) == want
        families.add(key.family)
    assert families == {"lookup", "legend"}
    for (b, at, digit), s in zip(batch.ask.tolist(), samples, strict=True):  # the key token
        assert tok.decode(batch.ids[b, at - 3:at + 2]).endswith(f"What is {s.record.key}?")
        assert tok.decode(batch.ids[b, at:at + 1]).strip() == s.record.key
        assert tok.decode([digit]) == s.record.answer


def test_generated_pdfs_render_to_the_training_pixels(tmp_path):
    rows = generate(tmp_path, 9, seed=4)
    assert len(rows) == 9 and {r["family"] for r in rows} == set(FAMILIES)
    lines = [json.loads(x) for x in (tmp_path / "questions.jsonl").read_text().splitlines()]
    assert lines == rows
    for key in ("id", "doc", "question", "answer", "answer_format", "evidence_pages"):
        assert all(key in r for r in lines)
    assert Settings().render_dpi == RENDER_DPI
    doc = make_document(random.Random("generate:4:0"))
    pdf = pymupdf.open(tmp_path / "pdfs" / "t000.pdf")
    assert pdf.page_count == len(doc.pages)
    for i, page_rows in enumerate(doc.pages):
        img = np.asarray(render_page(pdf, i, dpi=RENDER_DPI, max_pixels=10**7))
        assert np.array_equal(img, draw_grid(page_rows))
        assert page_rows[1].strip() in pdf[i].get_text()  # the invisible text layer
    with pytest.raises(ValueError):
        generate(tmp_path / "big", 4001, seed=1)


def test_follow_up_turns_ask_answerable_records(parts):
    adapter, patches, layouts = parts
    s = draw_sample(random.Random(1), follow_ups=3)
    assert len(s.follow_ups) == 3 and s.record not in s.follow_ups
    assert all(p - 1 in s.pages for r in s.follow_ups for p in r.evidence_pages)
    batch = make_batch([s], layouts, patches)
    tok = adapter.tokenizer
    for (_, at, digit), r in zip(batch.follow[0::2].tolist(), s.follow_ups, strict=True):
        assert tok.decode([digit]) == r.answer and batch.ids[0, at + 1] == digit
        assert tok.decode(batch.ids[0, at - 15:at + 1]).endswith(
            f"What is {r.key}?<|im_end|>\n<|im_start|>assistant\n")
    for (_, at, digit), r in zip(batch.ask[1:].tolist(), s.follow_ups, strict=True):
        assert tok.decode(batch.ids[0, at - 3:at + 2]).endswith(f"What is {r.key}?")
        assert tok.decode(batch.ids[0, at:at + 1]).strip() == r.key
        assert tok.decode([digit]) == r.answer
    pos = batch.position_ids[:, 0]  # (3, N): the turns continue the text positions
    n_first = int(batch.answer[1, 1])
    assert torch.equal(pos[0, n_first:], torch.arange(pos[0, n_first], pos[0, n_first]
                                                       + pos.shape[1] - n_first))
