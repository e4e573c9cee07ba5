"""Results that are current: every file under lab/*/results/ is cited by a page (README.md,
docs/*.md, lab/README.md, a lab/*/NOTES.md), every result path a page cites exists, and the
result JSON in the tree stays under 2 MB. A result no page cites is history: git keeps it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITED = re.compile(r"lab/[a-z_]+/results/[A-Za-z0-9_.\-/]*[A-Za-z0-9_\-]")
JSON_BUDGET = 2 * 10**6


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "lab" / "README.md",
            *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "lab").glob("*/NOTES.md"))]


def _citations() -> dict[str, list[str]]:
    """Cited result path -> the pages citing it."""
    found: dict[str, list[str]] = {}
    for page in _pages():
        for path in CITED.findall(page.read_text()):
            found.setdefault(path, []).append(str(page.relative_to(ROOT)))
    return found


def _result_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "lab").glob("*/results/**/*")
                  if p.is_file())


def test_every_result_file_is_cited_by_a_page() -> None:
    cited = _citations()
    files = _result_files()
    assert files
    uncited = [f for f in files if f not in cited]
    assert not uncited, f"cited by no page (cite it or git rm it): {uncited}"


def test_every_cited_result_exists() -> None:
    missing = {path: pages for path, pages in _citations().items()
               if not (ROOT / path).exists()}
    assert not missing, f"cited but not in the tree: {missing}"


def test_result_json_stays_under_its_budget() -> None:
    total = sum((ROOT / f).stat().st_size for f in _result_files()
                if f.endswith((".json", ".jsonl")))
    assert total <= JSON_BUDGET, f"result JSON is {total} bytes, over {JSON_BUDGET}"
