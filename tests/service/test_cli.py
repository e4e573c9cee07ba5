"""The `conduit` command line as a user runs it: ingest with progress, then ask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.pdfs import text_pdf


def _conduit(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONDUIT_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_ingest_then_ask_json(tmp_path: Path) -> None:
    pdf = tmp_path / "atlas.pdf"
    pdf.write_bytes(text_pdf(["Mountains of the north: the highest peak is Mount Kestrel.",
                              "Rivers of the south: the Varn river floods every spring."]))
    bad = tmp_path / "broken.pdf"
    bad.write_bytes(b"not a pdf at all")
    done = _conduit(tmp_path / "home", "ingest", str(pdf), str(bad), "--collection", "geo")
    assert done.returncode == 1, done.stderr  # one file failed
    assert "atlas.pdf: 2 page(s)" in done.stdout
    assert "broken.pdf" in done.stderr and "PDF" in done.stderr

    asked = _conduit(tmp_path / "home", "ask", "Which river floods every spring?",
                     "--collection", "geo", "--json", "--top-k", "1", "--max-new-tokens", "4")
    assert asked.returncode == 0, asked.stderr
    out = json.loads(asked.stdout)
    assert out["citations"][0]["filename"] == "atlas.pdf"
    assert out["citations"][0]["page"] == 2
    assert out["timings"]["ttft_s"] > 0
    assert 0 < out["flops_ratio_total"] < out["flops_ratio_lm"]

    missing = _conduit(tmp_path / "home", "ask", "x", "--collection", "nope")
    assert missing.returncode == 2 and "nope" in missing.stderr
