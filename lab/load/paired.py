"""`conduit-lab bench load-paired`: one client's answer latency on the serial and the batched
engine, measured in pairs, so that the machine's drift cancels.

`conduit-lab bench load` runs its services one after the other, so on a shared machine its
1-client rows differ by whatever else ran meanwhile (±15% between runs of one engine). Here
both services of a form run at once (each on its own temporary home, the same seed document,
the same model), idle but for the one client, which asks the same question of each in turn,
the order alternating pair by pair (ABBA); an upload, every `upload_every`-th request, goes to
both. Each pair's latency ratio (batched / serial) is taken; the report gives the median
latency and TTFT of each engine, the median of the pair ratios and its 95% bootstrap interval.

    conduit-lab bench load-paired --form embedded,distributed --pairs 200 \\
        --model builtin:tiny-qwen2-vl --out lab/load/results/paired_one_client.json
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from lab.load.bench import Ask, Tally, ask_once, prepare, question_text, upload_once
from lab.load.services import FORM_LABELS, spawned

ENGINE_PAIR = ("serial", "batched")


def _median_ci(values: list[float], rng: random.Random, draws: int = 2000) -> list[float]:
    """95% bootstrap interval of the median of `values`."""
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return [round(meds[int(0.025 * draws)], 4), round(meds[int(0.975 * draws) - 1], 4)]


def paired_form(form: str, *, pairs: int, ask: Ask, model: str | None, warmup: int = 5,
                seed: int = 0) -> dict[str, Any]:
    """Both engines of `form` side by side: `pairs` question pairs from one client."""
    rng = random.Random(seed)
    with ExitStack() as stack:
        services = {e: stack.enter_context(spawned(form, engine=e, model=model))
                    for e in ENGINE_PAIR}
        clients = {e: stack.enter_context(httpx.Client(base_url=s.url, timeout=300))
                   for e, s in services.items()}
        collections = {e: prepare(s.url, {}) for e, s in services.items()}
        tallies = {e: Tally() for e in ENGINE_PAIR}
        rows: list[dict[str, float | None]] = []
        n = asked = 0
        while len(rows) < pairs and asked < 3 * (warmup + pairs):  # failed pairs: 2x at most
            n += 1
            if ask.upload_every and n % ask.upload_every == 0:
                pdf_seed = rng.randrange(1 << 30)
                for e in ENGINE_PAIR:
                    upload_once(clients[e], collections[e], tallies[e], pdf_seed)
                continue
            question = question_text(rng)
            asked += 1
            order = ENGINE_PAIR if asked % 2 else ENGINE_PAIR[::-1]  # ABBA
            got = {e: ask_once(clients[e], collections[e], question, ask, tallies[e])
                   for e in order}
            if asked > warmup and all(got.values()):
                rows.append({f"{e}_{k}": v for e in ENGINE_PAIR
                             for k, v in zip(("latency_s", "ttft_s"), got[e] or (), strict=True)})
    errors = {e: dict(t.errors) for e, t in tallies.items()}
    return {"form": FORM_LABELS[form], "model": model, "upload_every": ask.upload_every,
            "max_new_tokens": ask.max_new_tokens, "top_k": ask.top_k, "pairs": len(rows),
            "errors": errors, "command": " ".join(sys.argv), **summary(rows, rng)}


def summary(rows: list[dict[str, float | None]], rng: random.Random) -> dict[str, Any]:
    """Medians per engine and the paired ratios (batched / serial) with bootstrap intervals."""
    out: dict[str, Any] = {}
    for k in ("latency_s", "ttft_s"):
        both = [(s, b) for r in rows if (s := r[f"serial_{k}"]) and (b := r[f"batched_{k}"])]
        ratios = [b / s for s, b in both]
        for i, e in enumerate(ENGINE_PAIR):
            out[f"{e}_{k}_p50"] = round(statistics.median(p[i] for p in both), 4) if both else None
        out[f"ratio_{k}_p50"] = round(statistics.median(ratios), 4) if ratios else None
        out[f"ratio_{k}_ci95"] = _median_ci(ratios, rng) if ratios else None
    return out


def write_markdown(results: list[dict[str, Any]], path: Path) -> None:
    """One row per form and upload rate."""
    lines = [f"Command: `{results[0]['command']}`" if results else "", "",
             "| form | uploads | pairs | serial latency p50 s | batched latency p50 s | "
             "latency ratio p50 (95% CI) | serial TTFT p50 s | batched TTFT p50 s | "
             "TTFT ratio p50 (95% CI) | errors |", "|---|---|---:|---:|---:|---|---:|---:|---|---|"]
    for r in results:
        lat, tt = r["ratio_latency_s_ci95"], r["ratio_ttft_s_ci95"]
        errors = {e: v for e, v in r["errors"].items() if v} or "none"
        uploads = f"1 in {r['upload_every']}" if r["upload_every"] else "none"
        lines.append(
            f"| {r['form']} | {uploads} "
            f"| {r['pairs']} | {r['serial_latency_s_p50']} | {r['batched_latency_s_p50']} | "
            f"{r['ratio_latency_s_p50']} ({lat[0]}-{lat[1]}) | {r['serial_ttft_s_p50']} | "
            f"{r['batched_ttft_s_p50']} | {r['ratio_ttft_s_p50']} ({tt[0]}-{tt[1]}) | "
            f"{errors} |")
    path.write_text("\n".join(lines) + "\n")


def main(*, forms: list[str], pairs: int, upload_every: list[int], max_new_tokens: int,
         top_k: int, model: str | None, out: Path) -> list[dict[str, Any]]:
    """Run every form x upload rate; write `out` (JSON) and its markdown beside it."""
    results = []
    for form in forms:
        for every in upload_every:
            row = paired_form(form, pairs=pairs, ask=Ask(every, max_new_tokens, top_k),
                              model=model)
            print(json.dumps(row), flush=True)
            results.append(row)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=1) + "\n")
            write_markdown(results, out.with_suffix(".md"))
    return results
