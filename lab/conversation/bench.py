"""A conversation's follow-ups against its first turn: `conduit-lab bench conversation`.

The default builtin model (`builtin:small-qwen2-vl`, one torch thread) holds a conversation of
`--turns` turns with `--max-new-tokens`-token answers over three A4 pages: turn 1 asks over
the three pages (CONDUIT at 10%, its KV kept); the middle turns ask over the same pages, their
prefix kept (a hit: only the turn's own rows computed); the last turn brings one new page,
refreshed by the policy with the whole conversation before it. After the kept run, the same
conversation's last same-page follow-up is asked again with the conversation cache cleared
(a rebuild from text and page KV). Per turn: TTFT, LM FLOPs over a full prefill of the whole
conversation (`flops_ratio_lm`), whether the prefix was a hit or rebuilt; TTFT ratios are
against turn 1 of the same round. Medians over `--repeats` rounds after a warm-up round, all
in one process. Writes JSON and markdown (default lab/conversation/results/conversation.*).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from conduit_core.answer_types import AnswerRequest, AnswerResult, PageInput, Turn
from conduit_core.model.loader import load_vlm
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.ttft.default_model import a4_page
from worker.prompt import ANSWER_PREFIX, page_label

MODEL = "builtin:small-qwen2-vl"
RESULTS = Path(__file__).parent / "results"
QUESTIONS = ["What is the total amount due on the invoice?", "And who signed the contract?",
             "When was it signed?", "Does any line mention a late fee?",
             "What does the appendix add?"]


def _conversation(rt: ReuseRuntime, pages: list[PageInput], extra: PageInput, turns: int,
                  max_new_tokens: int) -> tuple[list[AnswerResult], AnswerResult]:
    """One conversation (module docstring): each turn's result, and the rebuilt follow-up."""
    rt.conversations.clear()
    history: tuple[Turn, ...] = ()
    results = []
    for t in range(turns):
        question = QUESTIONS[t % len(QUESTIONS)]
        added = pages if t == 0 else [extra] if t == turns - 1 else []
        result = answering.answer(rt, AnswerRequest(
            ANSWER_PREFIX, added, question, max_new_tokens=max_new_tokens, keep=True,
            history=history))
        results.append(result)
        history = (*history, Turn(tuple(added), question, result.text))
    rt.conversations.clear()  # the last same-page follow-up again, its prefix rebuilt
    last = turns - 2
    rebuilt = answering.answer(rt, AnswerRequest(
        ANSWER_PREFIX, [], QUESTIONS[last % len(QUESTIONS)], max_new_tokens=max_new_tokens,
        keep=True, history=history[:last]))
    return results, rebuilt


def _row(turn: str, results: list[AnswerResult], first: list[AnswerResult]) -> dict[str, Any]:
    ttft = statistics.median(r.ttft_s for r in results)
    ratio = statistics.median(r.ttft_s / f.ttft_s for r, f in zip(results, first, strict=True))
    one = results[0]
    return {"turn": turn, "ttft_ms_median": round(1e3 * ttft, 1),
            "ttft_vs_turn1": round(ratio, 3), "flops_ratio_lm": round(one.flops_ratio_lm, 4),
            "prompt_tokens": one.prompt_tokens, "new_visual_tokens": one.visual_tokens,
            "refreshed": one.refreshed_visual_tokens, "conversation": one.conversation or "-",
            "fallback": one.fallback}


def run(repeats: int, turns: int, max_new_tokens: int, command: str) -> dict[str, Any]:
    """Every turn's figures (module docstring)."""
    if turns < 3:
        raise ValueError("a conversation bench needs at least 3 turns")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        rt = ReuseRuntime(load_vlm(MODEL, cache_dir=Path(tmp)))
        kvs = rt.prefill_pages([a4_page(i) for i in range(4)])
        # each page named by an id, as the worker names it by its storage hash
        pages = [PageInput(page_label("report.pdf", i + 1), kv, page_id=f"page-{i}")
                 for i, kv in enumerate(kvs)]
        _conversation(rt, pages[:3], pages[3], turns, max_new_tokens)  # warm-up
        rounds = [_conversation(rt, pages[:3], pages[3], turns, max_new_tokens)
                  for _ in range(repeats)]
    first = [r[0][0] for r in rounds]
    rows = [_row("1: three pages", first, first)]
    for t in range(1, turns - 1):
        rows.append(_row(f"{t + 1}: same pages, prefix kept", [r[0][t] for r in rounds], first))
    rows.append(_row(f"{turns - 1}: same pages, prefix rebuilt", [r[1] for r in rounds], first))
    rows.append(_row(f"{turns}: one new page, prefix kept", [r[0][-1] for r in rounds], first))
    return {"model": MODEL, "pages": [kv.num_tokens for kv in kvs[:3]], "turns": turns,
            "max_new_tokens": max_new_tokens, "repeats": repeats, "threads": 1,
            "command": command, "date": time.strftime("%Y-%m-%d"), "rows": rows}


def write(doc: dict[str, Any], out: Path) -> None:
    """JSON at `out`, a markdown table beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# A conversation's follow-ups ({doc['date']})", "",
             f"Command: `{doc['command']}`", "",
             f"`{doc['model']}`, pages of {doc['pages']} visual tokens, {doc['turns']} turns "
             f"of {doc['max_new_tokens']}-token answers, one thread, medians of "
             f"{doc['repeats']} rounds after a warm-up. LM FLOPs are over a full prefill of the "
             "whole conversation at that turn.", "",
             "| turn | TTFT ms | TTFT / turn 1 | LM FLOPs | prompt tokens | refreshed | prefix |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['turn']} | {r['ttft_ms_median']} | {r['ttft_vs_turn1']} | "
                     f"{r['flops_ratio_lm']} | {r['prompt_tokens']} | {r['refreshed']} of "
                     f"{r['new_visual_tokens']} | {r['conversation']} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
