"""docs/RESULTS.md is generated from the committed results (`conduit-lab report results`):
the committed page is what the generator makes of the tree today, and every file it reads is
a committed result under lab/*/results/."""

from __future__ import annotations

from lab import results_doc


def test_results_page_is_up_to_date() -> None:
    committed = results_doc.DOC.read_text()
    assert committed == results_doc.render(), (
        "docs/RESULTS.md is out of date: run `conduit-lab report results` and commit it")


def test_every_section_reads_a_lab_result_and_has_a_table() -> None:
    page = results_doc.render()
    for section in results_doc.SECTIONS:
        assert section.source.startswith("lab/") and "/results/" in section.source
        assert f"Source: `{section.source}`" in page
        assert len(section.table(results_doc._read(section.source))) > 1, section.title
