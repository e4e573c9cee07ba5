"""What the upload fuzz feeds the upload path (issue 30), shared by its two modes
(`uploads.py` in process, `uploads_http.py` through a served product): the source PDFs,
the deterministic plan of mutants and each mutation, and a process's peak RSS.

Sources: the smallest PDFs of the real dev set (read where they lie, never copied) and PDFs
built by `lab/ingest/builders.py`. A mutant is its source's name, a label and a seed; the
same seed always gives the same bytes.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from lab import DEVSET as LAB_DEVSET

DEVSET = LAB_DEVSET / "pdfs"
MUTATIONS = ("flip", "flip_structure", "truncate", "splice", "zero_range", "delete_range",
             "repeat_range")
STRUCTURE = (b" obj", b"endobj", b"stream", b"xref", b"trailer", b"startxref", b"/Type",
             b"/Pages", b"/Kids", b"/Length", b"/ObjStm", b"/XRef", b"/Root")


def builder_sources() -> list[tuple[str, bytes]]:
    """PDFs made by the test builders: text, two columns, an image-only page, object
    streams and a cross-reference stream (PyMuPDF's compact writer), and a small
    object-stream bomb (its page tree inflates to 50 MB at open)."""
    import pymupdf

    from lab.ingest.bad_pdfs import paper_pdf
    from lab.ingest.builders import image_only_page, pdf_bytes, text_pages_pdf, two_column_page
    from lab.ingest.objstm_bomb import objstm_bomb_pdf

    doc = pymupdf.open()
    two_column_page(doc)
    image_only_page(doc, ["Maintenance log", "Turbine 7 gearbox replaced"], footer="p. 2")
    mixed = pdf_bytes(doc)
    compact = pymupdf.open("pdf", mixed)
    packed = bytes(compact.tobytes(garbage=3, deflate=True, use_objstms=1))
    compact.close()
    return [("builders:text_pages", text_pages_pdf([f"Page {n} of the harbour report: the "
                                                    f"ferry leaves at {n}." for n in range(4)])),
            ("builders:mixed", mixed), ("builders:objstm", packed),
            ("builders:paper", paper_pdf(6)), ("builders:objstm_bomb_50k", objstm_bomb_pdf(50_000))]


def devset_sources(folder: Path, limit: int, max_bytes: int = 800_000) -> list[tuple[str, bytes]]:
    """The `limit` smallest PDFs of the dev set under `max_bytes` ([] when it is absent)."""
    if limit <= 0 or not folder.is_dir():
        return []
    files = sorted((p for p in folder.glob("*.pdf") if p.stat().st_size <= max_bytes),
                   key=lambda p: p.stat().st_size)[:limit]
    return [(f"devset:{p.name}", p.read_bytes()) for p in files]


def mutate(rng: random.Random, data: bytes, other: bytes) -> tuple[str, bytes]:
    """One mutant of `data` (`other`: a second file for splices): (mutation, bytes)."""
    kind = rng.choice(MUTATIONS)
    out = bytearray(data)
    n = len(out)
    if kind == "flip":
        for _ in range(rng.randint(1, 64)):
            out[rng.randrange(n)] ^= rng.randint(1, 255)
    elif kind == "flip_structure":
        marks = [i for word in STRUCTURE for i in _find_all(data, word)] or [n // 2]
        for _ in range(rng.randint(1, 16)):
            at = min(n - 1, max(0, rng.choice(marks) + rng.randint(-8, 24)))
            out[at] = rng.choice(b"0123456789 /<>[]()RTnobj\n\x00\xff")
    elif kind == "truncate":
        del out[rng.randint(16, n - 1):]
    elif kind == "splice":
        cut = rng.randint(16, n - 1)
        out = out[:cut] + other[rng.randrange(len(other)):]
    else:
        start = rng.randrange(n)
        size = min(n - start, rng.randint(1, max(1, n // 8)))
        if kind == "zero_range":
            out[start:start + size] = bytes(size)
        elif kind == "delete_range":
            del out[start:start + size]
        else:
            out[start:start] = bytes(out[start:start + size]) * rng.randint(1, 4)
    return kind, bytes(out)


def _find_all(data: bytes, word: bytes) -> list[int]:
    found: list[int] = []
    at = data.find(word)
    while at >= 0 and len(found) < 200:
        found.append(at)
        at = data.find(word, at + 1)
    return found


def mutants(seed: int, count: int, sources: list[tuple[str, bytes]]
            ) -> list[tuple[str, str, int]]:
    """The plan: (source name, mutation seed label, seed) for each mutant; deterministic."""
    rng = random.Random(seed)
    return [(rng.choice(sources)[0], f"{seed}:{i}", rng.randrange(2**32)) for i in range(count)]


def hwm_kib(pid: int | str) -> int:
    """VmHWM (peak RSS) of process `pid` in KiB (0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def fuzz_sources(args: argparse.Namespace) -> list[tuple[str, bytes]]:
    """The fuzz's sources: the builders' PDFs and `--devset-files` of the dev set's
    smallest PDFs found under `--devset`; (name, bytes) each."""
    return builder_sources() + devset_sources(Path(args.devset), args.devset_files)
