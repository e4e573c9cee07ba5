"""Exact BM25 over stored stem counts equals bm25s's scores bit for bit."""

from __future__ import annotations

import numpy as np

from worker.retrieval.bm25 import bm25_scores, tokenize
from worker.retrieval.index.exact_bm25 import COUNT_BITS, exact_scores, page_entries, stem_keys

TEXTS = ["Turbine bearings vibrate; the turbine's bearing was replaced twice in 2023.",
         "", "the of and",  # no stems at all: length 0, as bm25s counts it
         "Dividend outlook: dividends rise, dividend policy unchanged. " * 12,
         "Bearing bearing bearing", "A dough recipe: oven at 220 C, dough rests an hour.",
         "Quarterly revenue and operating margin by segment, 2019-2023."]


def _exact(query: str, texts: list[str], picked: list[int]) -> np.ndarray:
    stems = tokenize(texts)
    entries = [page_entries(s) for s in stems]
    starts = np.cumsum([0] + [len(e) for e in entries])[:-1]
    flat = np.concatenate(entries)
    q = tokenize([query])[0]
    df = [sum(t in set(s) for s in stems) for t in q]
    lengths = np.array([len(s) for s in stems])
    return exact_scores(q, df, len(texts), float(lengths.mean()), starts[picked],
                        np.array([len(entries[i]) for i in picked]), lengths[picked], flat)


def test_page_entries_hold_each_stem_once_with_its_count() -> None:
    stems = tokenize(["bearing bearings turbine bearing oven"])[0]
    entries = page_entries(stems)
    assert np.all(np.diff(entries) > 0)
    counts = dict(zip((entries >> np.uint64(COUNT_BITS)).tolist(),
                      (entries & np.uint64(0xFFFF)).tolist(), strict=True))
    assert counts == {int(stem_keys(["bear"])[0]): 3, int(stem_keys(["turbin"])[0]): 1,
                      int(stem_keys(["oven"])[0]): 1}


def test_exact_scores_equal_bm25s_bit_for_bit() -> None:
    everyone = list(range(len(TEXTS)))
    for query in ["turbine bearing", "bearing bearing dividend", "dough oven zzqx",
                  "revenue 2019 margin", "the of", "dividend"]:
        expected = bm25_scores(query, TEXTS)
        got = _exact(query, TEXTS, everyone)
        assert got.dtype == np.float32
        assert got.tobytes() == expected.tobytes(), query
        some = [5, 0, 4]  # any subset of candidates, in any order, keeps its scores
        assert _exact(query, TEXTS, some).tobytes() == expected[some].tobytes(), query
