"""The command line prints only its own progress bars, results and warnings (issue 18): no
library noise (model-loading bars, MuPDF/Tesseract/Leptonica messages) on a damaged file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from lab.ingest.bad_pdfs import flip_content_bytes, paper_pdf

NOISE = ("Writing model shards", "Loading weights", "MuPDF", "zlib", "Leptonica", "Error in ",
         "Tesseract", "cannot be recognized", "too small")


def test_ingest_of_a_damaged_file_prints_only_progress_results_and_warnings(
        tmp_path: Path) -> None:
    pdf = tmp_path / "rot.pdf"
    # page 3's content stream is damaged (MuPDF complains), page 7 makes Tesseract and
    # Leptonica complain when OCR'd (a 2 x 36 pixel image over the page)
    pdf.write_bytes(flip_content_bytes(paper_pdf(6, noisy_last_page=True), [3]))
    env = {**os.environ, "CONDUIT_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           "CONDUIT_OCR": "true"}  # a fresh home: the builtin model is written on first use
    done = subprocess.run([sys.executable, "-m", "service.cli", "ingest", str(pdf),
                           "--collection", "papers"], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r".*rot\.pdf: 7 page\(s\) -> document doc_\w+\n", done.stdout)
    assert f"{pdf}: warning: 1 of 7 pages could not be read and were left out: 3. " \
           "(page 3: " in done.stderr
    for line in re.split(r"[\r\n]+", done.stderr):
        if line.startswith(f"{pdf}: "):  # this command's own message (quotes the reason)
            continue
        assert not any(word in line for word in NOISE), line
        assert not line or line.startswith("rot.pdf:"), line  # a progress bar of this file
