"""Per-answer records of an answer evaluation (resumable) and the result rows built from them.

Records live in a JSONL file beside the results (`RESULTS.records.jsonl` for
`RESULTS.json`): a header line `{"config": {...}, "model_revision": "..."}` (what changes
answers: model, dtype, pages mode, top-k, page cap, max new tokens, prefix; and the loaded
weights' revision, a digest or hub commit, pinned once the model has loaded, so that a
builtin whose weights changed under the same name is not resumed), then one line per answer:
`{"id", "policy", "budget", "answer", "score", "agree", "flops_ratio_lm",
"flops_ratio_total", "ttft_ms", "kv_load_ms", "refreshed", "visual", "pages", ...}`.
The reference answer (full prefill from the page images) is `policy: full_prefill,
budget: 1.0`; the second reference (full prefill from the cached page embeddings, see
`runner`) is `policy: full_prefill_cached, budget: 1.0`. A rerun with the same header skips
the (id, policy, budget) already recorded; a different header raises `RecordsMismatchError`
rather than mixing two settings.

Rows (`build_rows`) score the recorded answer texts again with the current rules (a
record's `score` and `agree` are as they were when it was written): per group (see
`EvalItem.groups`: `all`, `doc_type=`, `source=`, `family=`) and per cell (the reference,
the cached reference, then every policy x budget), over the questions that have both that
answer and the reference:
  n, accuracy (mean score), accuracy_ratio_to_full (accuracy / the reference's accuracy
  over the same questions; None when that is 0), agreement_with_full (share of answers whose
  normalised answer equals the reference's), flops_ratio_lm and flops_ratio_total (means),
  ttft_ms_median (runtime TTFT plus the question's page-KV load for reuse policies and the
  cached reference), fallback_share (share of answers where the runtime ran its full
  prefill from cached embeddings instead of the policy; None for the reference, whose
  records use `fallback` for "answered on retrieved pages"), ttft_speedup_vs_full (the
  reference's median TTFT / this cell's, over the same questions) and
  ttft_speedup_vs_cached (the cached reference's median TTFT / this cell's, over those of
  the questions that also have the cached reference; None when none has).

Public API:
  REFERENCE = "full_prefill";  CACHED_REFERENCE = "full_prefill_cached"
  BUDGET_FREE    policies whose answers do not depend on the budget (run once per question)
  RecordsMismatchError(ValueError)
  Records(path, config)   .done(id, policy, budget) -> bool   .add(records)   .all() -> list
    .pin_model(revision)   the loaded weights' revision: recorded, or checked against the file's
  build_rows(items, records, policies, budgets) -> list[dict]
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lab.answers.grading import agreement, score_answer
from lab.answers.questions import EvalItem

REFERENCE = "full_prefill"
CACHED_REFERENCE = "full_prefill_cached"  # not a registered policy: a second reference
BUDGET_FREE = frozenset({"full_reuse", "prefix_reuse"})  # the same answers at every budget
Record = dict[str, Any]


class RecordsMismatchError(ValueError):
    """The records file beside `--out` was written with other settings."""


class Records:
    """The append-only record file of one evaluation (see the module docstring)."""

    def __init__(self, path: Path, config: dict[str, Any]):
        self.path = path
        self._config = config
        self._revision: str | None = None
        self._records: dict[tuple[str, str, float], Record] = {}
        if path.exists() and path.stat().st_size:
            text = path.read_text(encoding="utf-8")
            if not text.endswith("\n"):  # cut short by an interrupted run: end that line
                with path.open("a", encoding="utf-8") as fh:
                    fh.write("\n")
            lines = text.splitlines()
            first = json.loads(lines[0])
            self._revision = first.get("model_revision")
            header = first.get("config")
            if header != config:
                changed = sorted(k for k in set(header or {}) | set(config)
                                 if (header or {}).get(k) != config.get(k))
                raise RecordsMismatchError(
                    f"{path} holds answers made with other settings ({', '.join(changed)}); "
                    "use another --out or delete that file to start over")
            for line in lines[1:]:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by an interrupted run
                    continue
                self._records[self._key(rec)] = rec
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"config": config}) + "\n", encoding="utf-8")

    def pin_model(self, revision: str) -> None:
        """Tie the records to the loaded model's weights (`ModelFingerprint.revision`): a new
        file records it; a file written with other weights, or before weights were
        recorded, raises `RecordsMismatchError`."""
        if self._revision == revision:
            return
        if self._revision is None and not self._records:
            header = {"config": self._config, "model_revision": revision}
            self.path.write_text(json.dumps(header) + "\n", encoding="utf-8")
            self._revision = revision
            return
        raise RecordsMismatchError(
            f"{self.path} holds answers made with other weights of this model "
            f"({self._revision or 'not recorded'} against {revision}); use another --out or "
            "delete that file to start over")

    @staticmethod
    def _key(rec: Record) -> tuple[str, str, float]:
        return str(rec["id"]), str(rec["policy"]), float(rec["budget"])

    def done(self, qid: str, policy: str, budget: float) -> bool:
        """Whether this answer is recorded."""
        return (qid, policy, float(budget)) in self._records

    def get(self, qid: str, policy: str, budget: float) -> Record | None:
        """The recorded answer, if any."""
        return self._records.get((qid, policy, float(budget)))

    def add(self, records: Iterable[Record]) -> None:
        """Append records (one question's, typically) and flush them to disk."""
        new = list(records)
        with self.path.open("a", encoding="utf-8") as fh:
            for rec in new:
                fh.write(json.dumps(rec) + "\n")
        for rec in new:
            self._records[self._key(rec)] = rec

    def all(self) -> list[Record]:
        """Every record, in insertion order."""
        return list(self._records.values())


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def _score(item: EvalItem, rec: Record) -> float:
    """The record's score under the current rules (records keep the answer text)."""
    return score_answer(item.answer, str(rec["answer"]), item.answer_format)


def _ttft(rec: Record) -> float:
    """Time to first token in ms, the page-KV load included (0 for the reference)."""
    return float(rec["ttft_ms"]) + float(rec.get("kv_load_ms", 0.0))


def _speedup(base: Sequence[Record], mine: Sequence[Record]) -> float | None:
    """Median TTFT of `base` / median TTFT of `mine` (records of the same questions)."""
    if not mine:
        return None
    ours = statistics.median(_ttft(r) for r in mine)
    return round(statistics.median(_ttft(r) for r in base) / ours, 3) if ours > 0 else None


def build_rows(items: Sequence[EvalItem], records: Sequence[Record],
               policies: Sequence[str], budgets: Sequence[float]) -> list[dict[str, Any]]:
    """Result rows per group: the reference, the cached reference, then each policy x
    budget (see the module docstring)."""
    by_key = {(str(r["id"]), str(r["policy"]), float(r["budget"])): r for r in records}
    groups: dict[str, list[EvalItem]] = {}
    for item in items:
        for g in item.groups():
            groups.setdefault(g, []).append(item)
    by_id = {i.id: i for i in items}
    cells = [(REFERENCE, 1.0), (CACHED_REFERENCE, 1.0)] + [
        (p, float(b)) for p in policies if p not in (REFERENCE, CACHED_REFERENCE)
        for b in budgets]
    rows: list[dict[str, Any]] = []
    for group, members in groups.items():
        for policy, budget in cells:
            pairs = [(by_key[(i.id, REFERENCE, 1.0)], by_key[(i.id, policy, budget)])
                     for i in members
                     if (i.id, REFERENCE, 1.0) in by_key and (i.id, policy, budget) in by_key]
            if not pairs:
                continue
            scores = [(_score(by_id[str(ref["id"])], ref), _score(by_id[str(r["id"])], r))
                      for ref, r in pairs]
            acc = _mean([s for _, s in scores])
            ref_acc = _mean([s for s, _ in scores])
            cached = [(by_key[key], r) for _, r in pairs
                      if (key := (str(r["id"]), CACHED_REFERENCE, 1.0)) in by_key]
            rows.append({
                "group": group, "policy": policy, "budget": budget, "n": len(pairs),
                "accuracy": acc,
                "accuracy_ratio_to_full": (round(acc / ref_acc, 4)
                                           if acc is not None and ref_acc else None),
                "agreement_with_full": _mean([
                    float(agreement(r["answer"], ref["answer"], by_id[str(r["id"])].answer_format))
                    for ref, r in pairs]),
                "flops_ratio_lm": _mean([r["flops_ratio_lm"] for _, r in pairs]),
                "flops_ratio_total": _mean([r["flops_ratio_total"] for _, r in pairs]),
                "ttft_ms_median": round(statistics.median(_ttft(r) for _, r in pairs), 3),
                # answers where the policy would have cost more than a full prefill from
                # cached embeddings, which ran instead (None for the reference, which never
                # does: its records' `fallback` says it answered on retrieved pages)
                "fallback_share": None if policy == REFERENCE else _mean(
                    [float(r.get("fallback", False)) for _, r in pairs]),
                "ttft_speedup_vs_full": _speedup([ref for ref, _ in pairs],
                                                 [r for _, r in pairs]),
                "ttft_speedup_vs_cached": _speedup([c for c, _ in cached],
                                                   [r for _, r in cached]),
            })
    return rows
