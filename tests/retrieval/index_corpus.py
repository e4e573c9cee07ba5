"""A small synthetic corpus for the retrieval-index tests: documents of pages with real
embeddings (all-MiniLM-L6-v2), as ingestion stores them."""

from __future__ import annotations

import random

from storage.metadata import Document, DocumentId, MetadataStore, Page, new_id
from storage.metadata.records import CollectionId
from worker.retrieval import Embedder, embed_pages, embedding_to_bytes

TOPICS = {
    "turbine": "turbine blade pressure rotor maintenance vibration bearing inspection",
    "finance": "dividend revenue quarterly earnings shareholders profit margin outlook",
    "kitchen": "recipe flour butter oven baking dough sugar temperature",
    "network": "router firewall packet latency bandwidth switch protocol configuration",
    "medical": "patient dosage clinical trial symptoms treatment hospital diagnosis",
}
FILLER = "the report describes several aspects of this section in more detail".split()


def make_documents(embedder: Embedder, n_docs: int = 12, pages: int = 4, seed: int = 0
                   ) -> list[tuple[str, str, list[Page]]]:
    """`n_docs` documents `(id, title, pages)`; each is about one topic, its pages mix that
    topic's words with filler and an occasional error code only that page holds."""
    rng = random.Random(seed)
    out = []
    names = list(TOPICS)
    for d in range(n_docs):
        topic = names[d % len(names)]
        doc_id = f"doc_{d:03d}_{topic}"
        title = f"{topic} handbook volume {d}"
        texts = []
        for n in range(pages):
            words = rng.choices(TOPICS[topic].split(), k=40) + rng.choices(FILLER, k=30)
            if rng.random() < 0.3:
                words.append(f"E{d:02d}{n}X")
            rng.shuffle(words)
            texts.append(" ".join(words))
        vectors = embed_pages(texts, embedder, contexts=[title] * pages)
        out.append((doc_id, title, [
            Page(document_id=DocumentId(doc_id), number=n + 1, page_hash=f"h{d}_{n}",
                 text=t, text_source="text_layer", image_path=f"pages/{doc_id}/{n}.png",
                 width=10, height=10, context=title,
                 embedding=None if v is None else embedding_to_bytes(v))
            for n, (t, v) in enumerate(zip(texts, vectors, strict=True))]))
    return out


def store_document(meta: MetadataStore, collection_id: CollectionId, doc_id: str,
                   pages: list[Page]) -> None:
    """Write a ready document with its pages, as the ingest job does."""
    meta.add_document(Document(id=DocumentId(doc_id), collection_id=collection_id,
                               filename=f"{doc_id}.pdf", sha256=new_id("s"), size_bytes=1))
    meta.put_pages(DocumentId(doc_id), pages)
    meta.update_progress(DocumentId(doc_id), status="ready", stage="done",
                         pages_done=len(pages), pages_total=len(pages))
