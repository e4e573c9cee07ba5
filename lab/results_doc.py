"""docs/RESULTS.md, generated from committed result files (`conduit-lab report results`).

Contract: `render()` reads only the files named in `SECTIONS` (paths relative to the
repository root) and returns the page as text; the same tree gives the same bytes (no clock,
no machine: dates and commands come from the files themselves). `write()` writes it to
`docs/RESULTS.md`; tests/lab/test_results_doc.py fails when the committed page differs from
`render()`. A figure the README or a notes page quotes belongs here, under the file it
comes from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "RESULTS.md"
COMMAND = "conduit-lab report results"

Table = list[list[str]]


@dataclass(frozen=True)
class Section:
    """One subject's headline table: its title, what it measured, its source file and the
    function that turns the file's content into rows (the first row is the header)."""

    title: str
    what: str
    source: str
    table: Callable[[Any], Table]


def _read(path: str) -> Any:
    """A JSON file, or a JSONL file as a list of its rows."""
    text = (ROOT / path).read_text()
    if path.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _default_model(doc: dict[str, Any]) -> Table:
    rows = [["method", "TTFT ms", "speed-up", "LM FLOPs", "decode tokens/s", "64-token answer s"]]
    for r in doc["rows"]:
        rows.append([r["method"], _f(r["ttft_ms_median"], 1), _f(r["speedup_vs_full_prefill"], 2)
                     + "x", _f(r["flops_ratio_lm"], 3), _f(r["decode_tokens_per_s"], 1),
                     _f(r["answer_s_median"], 2)])
    return rows


def _ttft_bench(doc: dict[str, Any]) -> Table:
    rows = [["method", "tier", "TTFT ms", "speed-up", "LM FLOPs"]]
    for r in doc["rows"]:
        rows.append([r["method"], r["tier"], _f(r["ttft_ms_median"], 1),
                     _f(r["speedup"], 2) + "x", _f(r["flops_ratio_lm"], 3)])
    return rows


def _testbed(doc: dict[str, Any]) -> Table:
    rows = [["policy", "budget", "accuracy", "of full prefill", "split", "legend",
             "lowest family", "LM FLOPs", "TTFT speed-up"]]
    family: dict[tuple[str, float], dict[str, float]] = {}
    for r in doc["rows"]:
        if r["group"].startswith("family="):
            family.setdefault((r["policy"], r["budget"]), {})[
                r["group"].removeprefix("family=")] = r["accuracy_ratio_to_full"]
    for r in doc["rows"]:
        if r["group"] == "all" and (r["budget"] == 0.1 or r["policy"] == "full_prefill"):
            fam = family.get((r["policy"], r["budget"]), {})
            low = min(fam, key=fam.__getitem__) if fam else None
            rows.append([r["policy"], _f(r["budget"], 2), _f(r["accuracy"], 3),
                         _f(r["accuracy_ratio_to_full"], 3), _f(fam.get("split"), 3),
                         _f(fam.get("legend"), 3),
                         f"{_f(fam[low], 3)} ({low})" if low else "-",
                         _f(r["flops_ratio_lm"], 3), _f(r["ttft_speedup_vs_full"], 2) + "x"])
    return rows


def _across_seeds(doc: dict[str, Any]) -> Table:
    rows = [["policy", "budget", "mean accuracy", "per checkpoint", "mean LM FLOPs"]]
    for r in doc["rows"]:
        if r["group"] == "all" and (r["budget"] == 0.1 or r["policy"] == "full_prefill"):
            runs = " / ".join(_f(a, 3) for a in r["accuracy"]["runs"])
            rows.append([r["policy"], _f(r["budget"], 2), _f(r["accuracy"]["mean"], 3), runs,
                         _f(r["flops_ratio_lm"]["mean"], 3)])
    return rows


def _load(doc: list[dict[str, Any]]) -> Table:
    rows = [["form", "uploads", "clients", "serial answers/s", "batched answers/s", "ratio",
             "batched /healthz p99 ms"]]
    by_key = {(r["form"], r["upload_every"], r["clients"], r["engine"]): r for r in doc}
    for (form, every, clients, engine), batched in by_key.items():
        serial = by_key.get((form, every, clients, "serial"))
        if engine != "batched" or serial is None:
            continue
        rows.append([form, f"1 in {every}" if every else "none", str(clients),
                     _f(serial["throughput_rps"], 1), _f(batched["throughput_rps"], 1),
                     _f(batched["throughput_rps"] / serial["throughput_rps"], 2) + "x",
                     _f(1000 * batched["healthz_latency_s"]["p99"], 0)])
    return rows


def _store(doc: dict[str, Any]) -> Table:
    rows = [["tier", "op", "MB/s", "raw MB/s", "of raw"]]
    for r in doc["rows"]:
        rows.append([r["tier"], r["op"], _f(r["mb_per_s"], 0), _f(r["raw_mb_per_s"], 0),
                     _f(r["fraction"], 2)])
    return rows


def _recall(configs: dict[str, dict[str, Any]]) -> Table:
    rows = [["configuration", "page recall@1", "@3", "@5", "@10", "document hit@10"]]
    for name, r in configs.items():
        recall = r["page_recall"]
        rows.append([name, *(_f(recall[k], 3) for k in ("1", "3", "5", "10")),
                     _f(r["doc_hit"]["10"], 3)])
    return rows


def _conversation(doc: dict[str, Any]) -> Table:
    rows = [["turn", "TTFT ms", "TTFT / turn 1", "LM FLOPs", "prompt tokens", "prefix"]]
    for r in doc["rows"]:
        rows.append([r["turn"], _f(r["ttft_ms_median"], 1), _f(r["ttft_vs_turn1"], 3),
                     _f(r["flops_ratio_lm"], 4), str(r["prompt_tokens"]), r["conversation"]])
    return rows


def _gaps(doc: dict[str, Any]) -> Table:
    rows = [["engine", "steady gap ms", "p99 gap / steady of its batch size",
             f"p99 gap / {doc['running']}-answer steady", "newcomers' TTFT p50 ms",
             "tokens/s at 32 clients"]]
    for name, r in doc["engines"].items():
        rows.append([name, _f(r["steady_gap_ms"], 1), _f(r["p99_over_steady"], 2) + "x",
                     _f(r["p99_over_running_steady"], 2) + "x",
                     _f(r["newcomer_ttft_ms"]["p50"], 0),
                     ", ".join(_f(t, 1) for t in r["tokens_per_s"])])
    return rows


SECTIONS = [
    Section("The default model on a 3-page question",
            "`builtin:small-qwen2-vl` (random weights), 3 pages of 496 visual tokens, 64-token "
            "answers, one thread, medians after a warm-up; speed-up against a full prefill "
            "with the vision tower. `default` is `conduit_focus`, the default when this ran, "
            "`default_before` `conduit_per_page` at its depth 0.8 with the labels the question "
            "reads, the default again since; on these random weights both refresh the same "
            "tokens (`conduit_focus`'s cap binds).",
            "lab/ttft/results/default_model.json", _default_model),
    Section("A conversation's follow-ups",
            "`conduit-lab bench conversation`: the default builtin, 3 pages, 5 turns of "
            "64-token answers, one thread, medians of 5 rounds; LM FLOPs over a full prefill "
            "of the whole conversation at that turn, TTFT against turn 1 of the same round.",
            "lab/conversation/results/conversation.json", _conversation),
    Section("Time to first token, CPU bench",
            "8 pages of 256 visual tokens on a CPU-sized model with 7B ratios, page KV in the "
            "memory tier, one thread; budgets 0.1 (CacheBlend 0.15). `conduit` rows recompute "
            "every stale label; `default` is `conduit_focus`, the default when this ran, "
            "`per_page_08_read` `conduit_per_page`, the default again since, both recomputing "
            "the labels the question reads.",
            "lab/ttft/results/ttft_cpu_2026-12-07.json", _ttft_bench),
    Section("Testbed answers at 10%",
            "The trained testbed model (committed weights), 1,000 questions of a held-out "
            "seed over evidence and distractor pages, through the normal ingest and page-KV "
            "path. `conduit_per_page` is the default (`conduit_focus` was, when this ran). "
            "The split and legend columns give the ratio to full prefill on those families, the "
            "ones that decide the bar of at least 97% on every family; the lowest family, the "
            "lowest of the five.",
            "lab/testbed/results/answers_default_2026-12-07.json", _testbed),
    Section("Testbed answers over three checkpoints",
            "The same 1,000 questions on three checkpoints of the training recipe (seeds 0, 1, "
            "2), page labels recomputed by the refresh.",
            "lab/testbed/results/across_seeds_fresh_labels.json", _across_seeds),
    Section("Many questions at once",
            "`conduit-lab bench load` with the tiny builtin, 64-token answers over 2 pages; "
            "the serial engine answers one question at a time, the batched one is the default.",
            "lab/load/results/matrix_tiny_2026-12-05.jsonl", _load),
    Section("Streams while questions arrive",
            "`conduit-lab bench gaps`: the default builtin, 8 answers decoding and 8 questions "
            "arriving at once, one thread; `before` the engine that ran each prefill pass "
            "whole, `after` this tree's (phases of a layer's attention or MLP within a share "
            "of the decode step); throughput with 32 clients and 16 slots, pairs run back to "
            "back.",
            "lab/load/results/gaps.json", _gaps),
    Section("KV store tiers",
            "16 pages of 256 tokens at 7B shapes in bfloat16, best of 7; raw is the same bytes "
            "moved without the store (the memory tier holds objects, no copy).",
            "lab/store/results/store.json", _store),
    Section("Retrieval on the hard dev set",
            "1,805 pages of 52 documents, 282 questions, whole collection.",
            "lab/retrieval/results/retrieval_hardset.json",
            lambda doc: _recall(doc["results"]["collection"])),
    Section("Retrieval on MMLongBench-Doc's dev set",
            "32 real PDFs (1,264 pages), 222 questions, whole collection.",
            "lab/retrieval/results/retrieval_mmlongbench_dev.json",
            lambda doc: _recall(doc["configs"])),
    Section("One H200 at Qwen2.5-VL-7B's shapes",
            "Random weights in bfloat16, 8 pages of 256 visual tokens, page KV in host memory "
            "or on disk (page cache dropped).",
            "lab/gpu/results/h200-20261204/ttft/ttft.json", _ttft_bench),
]


def _provenance(doc: Any) -> str:
    """The command (and date) a result file records about itself."""
    if isinstance(doc, list):
        doc = doc[0] if doc else {}
    meta = doc.get("meta") or doc.get("workload") or doc
    command = meta.get("command")
    date = meta.get("date")
    parts = [f"command: `{command}`" if command else "", f"date: {date}" if date else ""]
    return "; ".join(p for p in parts if p)


def _markdown(table: Table) -> list[str]:
    header, *body = table
    align = ["---"] + ["---:" if _numeric(body, i) else "---" for i in range(1, len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines


def _numeric(body: Table, column: int) -> bool:
    return all(row[column].rstrip("x").replace(".", "", 1).lstrip("-").isdigit() or
               row[column] == "-" for row in body)


def render() -> str:
    """The whole page, from the files in `SECTIONS`."""
    out = ["# Results", "",
           f"Generated by `{COMMAND}` (`lab/results_doc.py`) from the committed result files "
           "named under each table; edit those, not this page. What each subject found, and "
           "how to rerun it: `lab/README.md` and `lab/<subject>/NOTES.md`.", ""]
    for s in SECTIONS:
        doc = _read(s.source)
        out += [f"## {s.title}", "", s.what, "", f"Source: `{s.source}`"]
        provenance = _provenance(doc)
        if provenance:
            out += [f"({provenance})"]
        out += ["", *_markdown(s.table(doc)), ""]
    return "\n".join(out)


def write(path: Path = DOC) -> Path:
    """Write the page to `path` (docs/RESULTS.md by default); return the path."""
    path.write_text(render())
    return path
