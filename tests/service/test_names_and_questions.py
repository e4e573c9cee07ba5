"""Issue 70, item 5: a question with no letter or digit is a 422 (before: whitespace got a 200
answer), and a file name keeps printable characters only: ESC and U+202E (right-to-left
override) are stored, listed and printed as their escapes, never as the characters."""

from __future__ import annotations

import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import httpx
import pytest

from tests.pdfs import text_pdf

HOSTILE = "rep\x1b[2Jort\u202efdp.pdf"
SHOWN = "rep\\x1b[2Jort\\u202efdp.pdf"


def _controls(text: str) -> list[str]:
    """Control and format characters of `text`, but for the line ends a terminal expects."""
    return [c for c in text if unicodedata.category(c) in ("Cc", "Cf") and c not in "\n\r"]


@pytest.mark.parametrize("question", ["   ", "\t\n", "?!  ...", "\u200b"])
def test_a_question_without_letters_or_digits_is_422(server: tuple[str, Path],
                                                     question: str) -> None:
    url, _ = server
    with httpx.Client(base_url=url, timeout=120) as client:
        made = client.post("/v1/collections", json={"name": f"q{ord(question[0])}{len(question)}"})
        col = made.json()["collection_id"]
        r = client.post("/v1/query", json={"collection_id": col, "question": question})
        assert r.status_code == 422 and "letter or digit" in r.text, r.text
        chat = client.post("/v1/chat/completions", json={
            "model": f"conduit:{col}", "messages": [{"role": "user", "content": question}]})
        assert chat.status_code == 422, chat.text


def test_a_file_name_is_stored_and_listed_printable(server: tuple[str, Path]) -> None:
    url, _ = server
    with httpx.Client(base_url=url, timeout=120) as client:
        col = client.post("/v1/collections", json={"name": "n"}).json()["collection_id"]
        up = client.post(f"/v1/collections/{col}/documents",
                         files={"file": (HOSTILE, text_pdf(["Valves."]), "application/pdf")})
        assert up.status_code == 202, up.text
        doc = client.get(f"/v1/documents/{up.json()['document_id']}").json()
        listed = client.get(f"/v1/collections/{col}/documents").json()
    assert doc["filename"] == SHOWN
    assert [d["filename"] for d in listed] == [SHOWN]


def test_the_cli_prints_no_control_characters(tmp_path: Path) -> None:
    pdf = tmp_path / HOSTILE
    pdf.write_bytes(text_pdf(["The pump is serviced in May."]))
    env = {**os.environ, "CONDUIT_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           "CONDUIT_OCR": "false"}
    done = subprocess.run([sys.executable, "-m", "service.cli", "ingest", str(pdf),
                           "--collection", "c"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert SHOWN in done.stdout
    assert _controls(done.stdout) == [] and _controls(done.stderr) == [], done.stderr[-500:]
