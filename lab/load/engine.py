"""`conduit-lab bench engine`: the answer engine alone, in one process (no HTTP, no retrieval,
no Redis), and where an answer's engine time goes, serial against batched.

For each slot count (1 is the serial engine), `clients` threads ask questions over two of
four A4 pages at the service's 100 dpi (about 500 visual tokens each on the default builtin),
with the service's default policy and budget, for `duration` seconds; every answer runs to
`max_new_tokens` (stop tokens off, so both engines decode the same number of tokens). From
the engine's own Prometheus histograms (`worker.engine_metrics`, deltas over the level): its
decode steps (mean wall time, rows a step) and its prefill phases (time an answer). An
answer's engine time is then its prefill plus its tokens' share of the decode steps:

    engine s / answer = prefill s / answer + tokens / answer x step s / rows a step

and the batched/serial throughput ratio that split predicts is printed beside the measured
one: with the prefill unbatched in both engines, it bounds what batching can give.

    conduit-lab bench engine --slots 1,16 --clients 32 --duration 40 \\
        --out lab/load/results/engine_alone.json
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from prometheus_client import REGISTRY

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.model.loader import load_vlm
from conduit_core.policies import choose_policy
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.ttft.default_model import a4_page
from worker.engine import AnswerEngine
from worker.engine_metrics import PREFILL_PHASES
from worker.prompt import ANSWER_PREFIX, page_label
from worker.settings import Settings


def _histograms() -> dict[str, float]:
    """Counts and sums of the engine's step, batch-size and prefill-phase histograms."""
    get = REGISTRY.get_sample_value
    out = {"steps": get("conduit_engine_step_seconds_count") or 0.0,
           "step_s": get("conduit_engine_step_seconds_sum") or 0.0,
           "rows": get("conduit_engine_batch_size_sum") or 0.0,
           "prefills": get("conduit_engine_prefill_phase_seconds_count",
                           {"phase": PREFILL_PHASES[-1]}) or 0.0}
    out["prefill_s"] = sum(get("conduit_engine_prefill_phase_seconds_sum", {"phase": p}) or 0.0
                           for p in PREFILL_PHASES)
    return out


def run_level(rt: ReuseRuntime, pages: list[PageInput], *, slots: int, clients: int,
              duration_s: float, max_new_tokens: int, policy: str, budget: float
              ) -> dict[str, Any]:
    """One engine with `slots` answer slots under `clients` threads for `duration_s`."""
    engine = AnswerEngine(lambda: rt, max_active=slots, max_kv_tokens=1 << 20,
                          queue_wait_s=3600.0)
    finished: list[tuple[float, int]] = []  # (end time, tokens) of each answer
    stop = time.perf_counter() + duration_s

    def client(i: int) -> None:
        j = 0
        while time.perf_counter() < stop:
            chosen = [pages[(i + j) % len(pages)], pages[(i + j + 1) % len(pages)]]
            question = f"What is the total amount due on invoice {i}-{j}, and who signed it?"
            result, _ = engine.answer(AnswerRequest(ANSWER_PREFIX, chosen, question,
                                                    policy=choose_policy(policy), budget=budget,
                                                    max_new_tokens=max_new_tokens))
            finished.append((time.perf_counter(), len(result.token_ids)))
            j += 1

    before, t0 = _histograms(), time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    wall_s = time.perf_counter() - t0  # the window and the answers still running at its end
    d = {k: v - before[k] for k, v in _histograms().items()}
    in_window = [n for end, n in finished if end <= stop]
    step_s = d["step_s"] / max(d["steps"], 1.0)
    rows = d["rows"] / max(d["steps"], 1.0)
    tokens = statistics.mean(n for _, n in finished) if finished else 0.0
    prefill_s = d["prefill_s"] / max(d["prefills"], 1.0)
    return {"slots": slots, "clients": clients, "duration_s": duration_s,
            "wall_s": round(wall_s, 3),
            "answers": len(in_window), "answers_per_s": round(len(in_window) / duration_s, 3),
            "tokens_per_answer": round(tokens, 1), "decode_steps": int(d["steps"]),
            "step_ms_mean": round(1e3 * step_s, 2), "rows_per_step": round(rows, 2),
            "prefill_ms_per_answer": round(1e3 * prefill_s, 1),
            "decode_ms_per_answer": round(1e3 * tokens * step_s / max(rows, 1.0), 1),
            "engine_ms_per_answer": round(1e3 * (prefill_s + tokens * step_s / max(rows, 1.0)),
                                          1)}


def run(*, model: str, slots: list[int], clients: int, duration_s: float,
        max_new_tokens: int, threads: int, command: str, device: str = "cpu"
        ) -> dict[str, Any]:
    """Every slot count in turn on one loaded model; see the module docstring."""
    torch.set_num_threads(threads)
    settings = Settings(device=device)
    with tempfile.TemporaryDirectory() as tmp:
        rt = ReuseRuntime(load_vlm(model, device=device, dtype=settings.core.torch_dtype,
                                   cache_dir=Path(tmp)))
        rt.reuse.stop_ids = []  # every answer decodes max_new_tokens tokens
        kvs = rt.prefill_pages([a4_page(i) for i in range(4)])
        pages = [PageInput(page_label("report.pdf", i + 1), kv) for i, kv in enumerate(kvs)]
        answering.answer(rt, AnswerRequest(ANSWER_PREFIX, pages[:2], "warm-up", max_new_tokens=4))
        levels = [run_level(rt, pages, slots=s, clients=clients, duration_s=duration_s,
                            max_new_tokens=max_new_tokens, policy=settings.core.policy,
                            budget=settings.core.budget) for s in slots]
    return {"model": model, "device": device, "dtype": settings.core.torch_dtype,
            "pages": [kv.num_tokens for kv in kvs], "threads": threads,
            "policy": settings.core.policy, "budget": settings.core.budget,
            "max_new_tokens": max_new_tokens, "command": command,
            "date": time.strftime("%Y-%m-%d"), "levels": levels}


def markdown(doc: dict[str, Any]) -> str:
    """The levels as a table, and each level's throughput against the first (measured, and
    predicted from the engine-time split)."""
    lines = [f"# The answer engine alone ({doc['date']})", "", f"Command: `{doc['command']}`",
             "", f"`{doc['model']}`, pages of {doc['pages']} visual tokens (two a question), "
             f"`{doc['policy']}` at {doc['budget']}, {doc['max_new_tokens']}-token answers, "
             f"{doc['device']} in {doc['dtype']}, {doc['threads']} torch thread(s), one "
             "process, no HTTP.", "",
             "| slots | clients | answers/s | decode step ms | rows a step | prefill ms / answer "
             "| decode ms / answer | engine ms / answer | throughput vs first: measured | "
             "predicted |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = doc["levels"][0]
    for lv in doc["levels"]:
        measured = lv["answers_per_s"] / max(base["answers_per_s"], 1e-9)
        predicted = base["engine_ms_per_answer"] / max(lv["engine_ms_per_answer"], 1e-9)
        lines.append(f"| {lv['slots']} | {lv['clients']} | {lv['answers_per_s']} | "
                     f"{lv['step_ms_mean']} | {lv['rows_per_step']} | "
                     f"{lv['prefill_ms_per_answer']} | {lv['decode_ms_per_answer']} | "
                     f"{lv['engine_ms_per_answer']} | {measured:.2f}x | {predicted:.2f}x |")
    return "\n".join(lines) + "\n"


def main(*, model: str, slots: list[int], clients: int, duration_s: float,
         max_new_tokens: int, threads: int, out: Path, command: str, device: str = "cpu"
         ) -> dict[str, Any]:
    """Run, write JSON at `out` and markdown beside it, print the table."""
    doc = run(model=model, slots=slots, clients=clients, duration_s=duration_s,
              max_new_tokens=max_new_tokens, threads=threads, command=command, device=device)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    table = markdown(doc)
    out.with_suffix(".md").write_text(table)
    print(table)
    return doc
