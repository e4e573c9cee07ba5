"""`conduit ask --conversation`: a stored conversation asked turn by turn from the command
line; the follow-up reads the first turn (a new process: its prefix rebuilt)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.pdfs import text_pdf
from tests.service.test_cli import _conduit


def test_ask_in_a_conversation(tmp_path: Path) -> None:
    pdf = tmp_path / "atlas.pdf"
    pdf.write_bytes(text_pdf(["Mountains of the north: the highest peak is Mount Kestrel.",
                              "Rivers of the south: the Varn river floods every spring."]))
    home = tmp_path / "home"
    assert _conduit(home, "ingest", str(pdf), "--collection", "geo").returncode == 0
    first = _conduit(home, "ask", "Which river floods every spring?", "--collection", "geo",
                     "--conversation", "new", "--json", "--top-k", "1",
                     "--max-new-tokens", "4")
    assert first.returncode == 0, first.stderr
    conv = first.stderr.split("conversation ")[1].split()[0]
    later = _conduit(home, "ask", "Tell me more.", "--collection", "geo", "--conversation", conv,
                     "--json", "--top-k", "1", "--max-new-tokens", "4")
    assert later.returncode == 0, later.stderr
    out = json.loads(later.stdout)
    assert out["cache"]["conversation"] == "rebuilt"  # another process: rebuilt from its turns
    assert out["citations"][0]["page"] == 2  # the page the first turn named
    assert out["prompt_tokens"] > json.loads(first.stdout)["prompt_tokens"]
    unknown = _conduit(home, "ask", "x", "--collection", "geo", "--conversation", "conv_nope")
    assert unknown.returncode == 2 and "conv_nope not found" in unknown.stderr
