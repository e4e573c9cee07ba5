"""Hybrid search with the real all-MiniLM-L6-v2 embedder over realistic page texts."""

from __future__ import annotations

import numpy as np
import pytest

from worker.retrieval import (
    EMBEDDING_DIM,
    Candidate,
    Embedder,
    PassageConfig,
    embed_pages,
    embedding_from_bytes,
    embedding_to_bytes,
    search,
    split_passages,
)

FILLER = ("The committee reviewed the budget and approved the minutes of the last meeting. "
          "Members discussed staffing, training and the schedule for next year. ") * 12

TEXTS = {
    "report:2": FILLER + "Water withdrawal at the Tampere site fell by 23% after closed-loop "
                         "cooling was installed.",
    "report:5": FILLER + "Our largest customer, Halvorsen Retail, accounted for 17% of revenue.",
    "manual:4": "Troubleshooting. E84: overtemperature in the control cabinet. Switch off, "
                "wait ten minutes and check the fans before restarting. " + FILLER,
    "manual:2": "Safety instructions. Wear gloves, goggles and hearing protection. Never "
                "operate the press when the room is hotter than 40 degrees Celsius. " + FILLER,
    "paper:3": "Results. GridFormer reaches 91.2% accuracy on ElectraLoad, ahead of the "
               "gradient boosting baseline. " + FILLER,
    "blank:1": "",
}


@pytest.fixture(scope="module")
def candidates(embedder: Embedder) -> list[Candidate]:
    keys = list(TEXTS)
    matrices = embed_pages([TEXTS[k] for k in keys], embedder)
    return [Candidate(k, TEXTS[k], m) for k, m in zip(keys, matrices, strict=True)]


@pytest.mark.parametrize(
    ("question", "page"),
    [
        ("By how much did water withdrawal fall at the Tampere site?", "report:2"),
        ("Which customer accounted for the largest share of revenue?", "report:5"),
        ("What does error E84 mean?", "manual:4"),
        ("What accuracy does GridFormer reach on ElectraLoad?", "paper:3"),
        # paraphrases: few or no shared content words with the page
        ("How much did the Finnish facility cut its H2O consumption?", "report:2"),
        ("Who is the biggest client?", "report:5"),
        ("What protective equipment must operators use?", "manual:2"),
    ],
)
def test_the_right_page_ranks_first(question: str, page: str, candidates: list[Candidate],
                                    embedder: Embedder) -> None:
    hits = search(question, candidates, top_k=3, embedder=embedder)
    assert hits[0].key == page, hits


def test_dense_ranking_rescues_a_paraphrase_bm25_misses(
        candidates: list[Candidate], embedder: Embedder) -> None:
    question = "Who is the biggest client?"
    bm25 = search(question, candidates, top_k=6, dense_weight=0.0)
    assert all(h.bm25_rank is None for h in bm25)  # no shared term after stop words
    hybrid = search(question, candidates, top_k=1, embedder=embedder)
    assert hybrid[0].key == "report:5" and hybrid[0].dense_rank == 1


def test_pages_without_embeddings_are_embedded_on_the_fly(embedder: Embedder) -> None:
    pages = [Candidate(k, t) for k, t in TEXTS.items()]
    hits = search("Which protective gear must press operators wear?", pages, top_k=2,
                  bm25_weight=0.0, embedder=embedder)
    assert hits[0].key == "manual:2" and hits[0].dense_rank == 1
    blank = next(h for h in search("x", pages, top_k=6, embedder=embedder)
                 if h.key == "blank:1")
    assert blank.dense_rank is None and blank.bm25_rank is None


def test_embeddings_are_unit_float32(embedder: Embedder) -> None:
    vectors = embedder.embed(["a harbour", "a bakery"])
    assert vectors.shape == (2, EMBEDDING_DIM) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, EMBEDDING_DIM)


def test_embedding_bytes_round_trip(embedder: Embedder) -> None:
    (matrix,) = embed_pages([FILLER * 3], embedder, PassageConfig(mode="max"))
    assert matrix is not None and matrix.shape[0] > 1  # a long page has several passages
    blob = embedding_to_bytes(matrix)
    assert len(blob) == matrix.shape[0] * EMBEDDING_DIM * 4
    assert np.array_equal(embedding_from_bytes(blob), matrix)
    single = embedding_from_bytes(embedding_to_bytes(matrix[0]))
    assert single.shape == (1, EMBEDDING_DIM)
    with pytest.raises(ValueError):
        embedding_from_bytes(b"\x00" * 10)
    with pytest.raises(ValueError):
        embedding_to_bytes(np.zeros((2, 7)))


def test_default_mean_mode_stores_one_vector(embedder: Embedder) -> None:
    text = FILLER * 3
    (matrix,) = embed_pages([text], embedder)
    assert matrix is not None and matrix.shape == (1, EMBEDDING_DIM)
    assert np.linalg.norm(matrix[0]) == pytest.approx(1.0, abs=1e-5)
    windows = embedder.embed(split_passages(text))
    mean = windows.mean(axis=0)
    assert np.allclose(matrix[0], mean / np.linalg.norm(mean), atol=1e-5)
    (first,) = embed_pages([text], embedder, PassageConfig(mode="first"))
    assert first is not None and np.allclose(first[0], windows[0], atol=1e-5)
    assert embed_pages(["", "  "], embedder) == [None, None]


def test_split_passages_overlaps_and_caps() -> None:
    words = " ".join(f"w{i}" for i in range(300))
    parts = split_passages(words, PassageConfig(words=100, overlap=20, max_passages=12))
    assert [p.split()[0] for p in parts] == ["w0", "w80", "w160", "w240"]
    assert parts[-1].split()[-1] == "w299"
    assert len(split_passages(words, PassageConfig(words=10, overlap=0, max_passages=3))) == 3
    assert split_passages("   ") == []


def test_query_embeddings_are_cached_and_match_batch_embeddings(embedder: Embedder) -> None:
    first = embedder.embed_query("When was the breakwater rebuilt?")
    assert embedder.embed_query("When was the breakwater rebuilt?") is first
    assert np.allclose(first, embedder.embed(["When was the breakwater rebuilt?"])[0],
                       atol=1e-5)
    assert not first.flags.writeable


def test_a_query_embedded_in_a_thread_is_the_same_vector(embedder: Embedder) -> None:
    """`submit_query` (the index embeds the question while BM25 ranks) gives what
    `embed_query` gives; a pool inherited through a fork (its threads are gone) is replaced."""
    import os

    from worker.retrieval import embedder as module

    question = "Which pier did the storm of 1953 damage?"
    vector = embedder.submit_query(question).result(timeout=60)
    assert np.array_equal(vector, embedder.embed_query(question))
    assert module._pool is not None
    inherited = module._pool[1]
    module._pool = (os.getpid() + 1, inherited)  # as a forked child sees its parent's pool
    again = embedder.submit_query(question + " again").result(timeout=60)
    assert module._pool[1] is not inherited and module._pool[0] == os.getpid()
    assert np.allclose(again, embedder.embed([question + " again"])[0], atol=1e-6)
    inherited.shutdown()
