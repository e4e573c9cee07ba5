"""Questions of an answer evaluation, in MMLongBench-Doc form (one JSON object a line).

Fields: `id`, `doc` (a file name in the PDF folder), `question`, `answer`, `answer_format`
(Str, Int, Float, List, None), `evidence_pages` (1-based; a list or a string such as
"[3, 5]"); optional `doc_type`, `evidence_sources` (a list or its string form), `family`
(the testbed generator's task family) and `shown_pages` (1-based, a list or its string form:
the evidence pages plus distractor pages of the same document, as a retriever's top-k would
show them; every evidence page must be among them). A line that breaks these rules raises
`QuestionsError` naming the file and line, before anything runs.

Public API:
  EvalItem(id, doc, question, answer, answer_format, evidence_pages, doc_type,
           evidence_sources, family, shown_pages)   .groups() -> list of group names
  QuestionsError(ValueError)
  load_items(paths) -> list[EvalItem]
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lab.answers.grading import FORMATS


class QuestionsError(ValueError):
    """A questions file that cannot be evaluated (its message names the file and line)."""


@dataclass(frozen=True)
class EvalItem:
    """One question with its key and the facets it is grouped by."""

    id: str
    doc: str
    question: str
    answer: str
    answer_format: str
    evidence_pages: tuple[int, ...]
    doc_type: str | None = None
    evidence_sources: tuple[str, ...] = ()
    family: str | None = None
    shown_pages: tuple[int, ...] = ()  # sorted; empty: the row names none

    def groups(self) -> list[str]:
        """`all`, then `doc_type=<t>`, `source=<s>` per evidence source, `family=<f>`."""
        out = ["all"]
        if self.doc_type:
            out.append(f"doc_type={self.doc_type}")
        out += [f"source={s}" for s in dict.fromkeys(self.evidence_sources)]
        if self.family:
            out.append(f"family={self.family}")
        return out


def _listish(value: object, where: str, name: str) -> list[object]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise QuestionsError(f"{where}: {name} must be a list, got {value!r}") from None
    if not isinstance(value, (list, tuple)):
        raise QuestionsError(f"{where}: {name} must be a list, got {value!r}")
    return list(value)


def _pages(row: dict[str, object], where: str, name: str) -> tuple[int, ...]:
    """The row's `name` field as sorted, distinct 1-based page numbers."""
    pages = _listish(row.get(name), where, name)
    numbers = [p for p in pages if isinstance(p, int) and not isinstance(p, bool) and p >= 1]
    if len(numbers) != len(pages):
        raise QuestionsError(f"{where}: {name} must be 1-based page numbers, got {pages!r}")
    return tuple(sorted(set(numbers)))


def _item(row: object, where: str) -> EvalItem:
    if not isinstance(row, dict):
        raise QuestionsError(f"{where}: expected a JSON object")
    missing = [k for k in ("id", "doc", "question", "answer", "answer_format") if k not in row]
    if missing:
        raise QuestionsError(f"{where}: missing field(s) {', '.join(missing)}")
    fmt = str(row["answer_format"])
    if fmt not in FORMATS:
        raise QuestionsError(f"{where}: answer_format {fmt!r} is not one of "
                             f"{', '.join(FORMATS)}")
    pages = _pages(row, where, "evidence_pages")
    shown = _pages(row, where, "shown_pages")
    hidden = sorted(set(pages) - set(shown)) if shown else []
    if hidden:
        raise QuestionsError(f"{where}: evidence page(s) {hidden} not among shown_pages "
                             f"{list(shown)}")
    sources = _listish(row.get("evidence_sources"), where, "evidence_sources")
    family = row.get("family")
    return EvalItem(
        id=str(row["id"]), doc=str(row["doc"]), question=str(row["question"]),
        answer=str(row["answer"]), answer_format=fmt,
        evidence_pages=pages,
        doc_type=str(row["doc_type"]) if row.get("doc_type") else None,
        evidence_sources=tuple(str(s) for s in sources),
        family=None if family in (None, "") else str(family),
        shown_pages=shown,
    )


def load_items(paths: Sequence[Path]) -> list[EvalItem]:
    """Every question of the files, in order; ids must be unique across them."""
    items: list[EvalItem] = []
    seen: dict[str, str] = {}
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise QuestionsError(f"{path}: cannot read: {exc.strerror or exc}") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise QuestionsError(f"{where}: not JSON ({exc.msg})") from None
            item = _item(row, where)
            if item.id in seen:
                raise QuestionsError(f"{where}: id {item.id!r} already used at {seen[item.id]}")
            seen[item.id] = where
            items.append(item)
    if not items:
        raise QuestionsError("no questions in " + ", ".join(str(p) for p in paths))
    return items
