"""On-disk layout of a collection's retrieval index and its manifest.

    <home>/index/<collection>/CURRENT        name of the live version folder (atomic replace)
    <home>/index/<collection>/writer.lock    the one-writer file lock
    <home>/index/<collection>/rebuild.lock   the one-rebuild file lock (held for a rebuild)
    <home>/index/<collection>/v<N>/text/     the Tantivy index (BM25 over stemmed tokens)
    <home>/index/<collection>/v<N>/vectors.f32  passage vectors, float32 rows, append-only
    <home>/index/<collection>/v<N>/pages.i64    page table, 7 int64 per page, append-only:
                                                document ordinal, number, first row, row count,
                                                first stem entry, distinct stems, stems
    <home>/index/<collection>/v<N>/terms.u64    every page's distinct stems with their counts,
                                                in page order, append-only (exact BM25,
                                                `exact_bm25.page_entries`)
    <home>/index/<collection>/v<N>/ivf-<tag>.centroids.f32  list centroids (large collections,
                                                             `ivf.py`); the manifest names the tag
    <home>/index/<collection>/v<N>/ivf-<tag>.lists.i32      each vector row's list, append-only
    <home>/index/<collection>/v<N>/manifest.json  what the files above hold (committed)

The manifest is written last (temp file, fsync, rename), so a reader never sees rows a writer
has not finished; rows past the manifest's counts are garbage from an interrupted write and
the next writer truncates them. The index is derived from the metadata store and can always be
rebuilt from it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

FORMAT = 3  # bump when the layout or the tokenisation changes: older indexes are rebuilt
# page-table columns, one int64 each: document ordinal, page number, first vector row and
# row count, first stem entry (`terms.u64`) and entry count, stems on the page
DOC, NUMBER, FIRST_ROW, ROW_COUNT, FIRST_ENTRY, ENTRY_COUNT, STEM_COUNT = range(7)
PAGE_FIELDS = 7  # int64 per page-table row


@dataclass
class Manifest:
    """What a version folder holds: documents by ordinal (None once deleted), committed page,
    vector-row and stem-entry (`terms`) counts, the vector width, a generation bumped by
    every commit, and the vectors' inverted file: its files' tag ("" while the collection is
    scored exactly), the rows it was trained on and its number of lists."""

    format: int = FORMAT
    generation: int = 0
    documents: list[str | None] = field(default_factory=list)
    page_counts: list[int] = field(default_factory=list)  # per document ordinal
    pages: int = 0
    rows: int = 0
    terms: int = 0
    dim: int = 0
    ivf: str = ""
    ivf_rows: int = 0
    ivf_lists: int = 0

    def live(self) -> dict[str, int]:
        """Live document id -> its number of indexed pages."""
        return {d: n for d, n in zip(self.documents, self.page_counts, strict=True)
                if d is not None}

    def dead_pages(self) -> int:
        """Pages of deleted documents still taking space (compaction rebuilds them away)."""
        return sum(n for d, n in zip(self.documents, self.page_counts, strict=True) if d is None)


def collection_dir(root: Path, collection_id: str) -> Path:
    """The folder of one collection's index under the index root (`<home>/index`)."""
    return root / collection_id


def current_version(cdir: Path) -> Path | None:
    """The live version folder, or None when the collection has no index yet."""
    try:
        name = (cdir / "CURRENT").read_text().strip()
    except FileNotFoundError:
        return None
    path = cdir / name
    return path if (path / "manifest.json").exists() else None


def usable_version(cdir: Path) -> Path | None:
    """The live version folder if it is in this code's layout (`FORMAT`); None when the
    collection has no index or only one of an older format (which a rebuild replaces)."""
    version = current_version(cdir)
    if version is None or read_manifest(version).format != FORMAT:
        return None
    return version


def set_current(cdir: Path, version: Path) -> None:
    """Point CURRENT at `version` atomically."""
    write_file(cdir / "CURRENT", version.name.encode())


def read_manifest(version: Path) -> Manifest:
    """The committed manifest of a version folder."""
    data = json.loads((version / "manifest.json").read_text())
    return Manifest(**data)


def write_manifest(version: Path, manifest: Manifest) -> None:
    """Commit a manifest (temp file, fsync, rename)."""
    # vars(), not asdict(): asdict deep-copies every list entry, a cost that grows with the
    # collection's documents on every commit
    write_file(version / "manifest.json", json.dumps(vars(manifest)).encode())


def ivf_paths(version: Path, tag: str) -> tuple[Path, Path]:
    """The centroid and lists files of the inverted file tagged `tag`."""
    return version / f"ivf-{tag}.centroids.f32", version / f"ivf-{tag}.lists.i32"


def write_file(path: Path, data: bytes) -> None:
    """Write a whole file atomically (temp file, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_raw(path: Path, data: bytes, committed_bytes: int) -> None:
    """Append `data` after the first `committed_bytes` of `path` (dropping anything an
    interrupted writer left past them) and fsync."""
    with open(path, "ab") as f:
        if f.tell() != committed_bytes:
            f.truncate(committed_bytes)
            f.seek(committed_bytes)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
