"""The persistent per-collection retrieval index (issue 16): Tantivy BM25 over the scan
path's stemmed tokens plus memory-mapped passage vectors, kept in step with the metadata store
by incremental hooks, a consistency check and background rebuilds (`maintain.py`).
"""

from worker.retrieval.index.maintain import IndexCheck, RetrievalIndexes
from worker.retrieval.index.reader import IndexReader
from worker.retrieval.index.search import DEFAULT_DEPTH, search_index
from worker.retrieval.index.writer import IndexDocument, IndexPage

__all__ = ["DEFAULT_DEPTH", "IndexCheck", "IndexDocument", "IndexPage", "IndexReader",
           "RetrievalIndexes", "search_index"]
