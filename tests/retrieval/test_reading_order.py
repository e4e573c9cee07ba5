"""Retrieved pages reach the model in reading order; citations keep the ranking."""

from storage.metadata import DocumentId
from storage.metadata.records import Page
from worker.answer_job import reading_order


def _page(doc: str, number: int) -> Page:
    return Page(document_id=DocumentId(doc), number=number, page_hash=f"{doc}{number}",
                text="", text_source="text_layer", image_path="", width=1, height=1)


def test_documents_by_best_hit_and_pages_in_order():
    hits = [(_page("b", 7), 0.9), (_page("a", 3), 0.8), (_page("b", 2), 0.7),
            (_page("a", 1), 0.6), (_page("b", 5), 0.5)]
    order = [(p.document_id, p.number) for p in reading_order(hits)]
    assert order == [("b", 2), ("b", 5), ("b", 7), ("a", 1), ("a", 3)]
    assert reading_order([]) == []
