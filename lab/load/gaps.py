"""`conduit-lab bench gaps`: do running answers keep streaming while newcomers are prefilled,
and does the engine still batch? Two answer engines side by side in one process on one
loaded model: the product's (`worker.engine`) and the one at `--baseline` (its
`worker/engine.py` read from git and imported beside it), so both run the same model,
pages and questions. The product's runs its newcomers' scoring pass and refresh in groups of
`--layer-group` decoder layers (`ReuseRuntime(layer_group=...)`, the service's
`CONDUIT_PREFILL_LAYER_GROUP` by default), the baseline's each pass whole (0), each engine
on its own runtime over the one loaded model.

Arrivals (`--repeats` trials an engine, the engines alternating): `running` answers decode
long answers over two of eight A4 pages at the service's 100 dpi; once every one of them has
streamed `STEADY_TOKENS` tokens, `arriving` new questions are submitted at once. From the
running answers' token times: the steady gap (median gap between consecutive tokens before
the arrivals, all running answers decoding) and the gaps during the arrivals (those ending
after the newcomers were submitted and starting before the last newcomer's first token):
their p50, p99 and max, pooled over the running answers and trials. The criterion is p99
over steady at most 2. The newcomers' median time to first token is reported beside it, so
that streams kept flowing by delaying the newcomers would show.

Throughput (`--pairs` runs an engine, alternating): `clients` threads ask two-page questions
against `--slots` answer slots for `--warmup` seconds, then `--duration` seconds more: the
answers that ended and the tokens decoded in the second span, a second. The machine's load
drifts between runs, so the comparison is the ratio within each pair (run back to back, the
order alternating) and its median.

Every answer runs to its `max_new_tokens` (stop tokens off). Default model, service policy
and budget; one torch thread; both engines warmed with the same questions first.

    conduit-lab bench gaps --repeats 3 --pairs 2 --warmup 8 --duration 15 \\
        --out lab/load/results/gaps.json
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np
import torch
from prometheus_client import REGISTRY

from conduit_core.answer_types import AnswerRequest, AnswerResult, PageInput
from conduit_core.model.loader import load_vlm
from conduit_core.policies import PolicyChoice
from conduit_core.policies.choice import PolicyOptions
from conduit_core.runtime import ReuseRuntime
from lab.load.bench import percentiles
from lab.ttft.default_model import a4_page
from worker import engine as product_engine
from worker.engine_metrics import GROUP_PHASES, PREFILL_PHASES
from worker.policy_options import settle_policy
from worker.prompt import ANSWER_PREFIX, page_label
from worker.settings import Settings

STEADY_TOKENS = 32  # tokens every running answer has streamed before the newcomers arrive
PAGES = 8
ROOT = Path(__file__).resolve().parents[2]


class Engine(Protocol):
    """What both engines offer the bench."""

    def answer(self, request: AnswerRequest, on_token: Any = None, cancel: Any = None,
               tenant: str = "") -> tuple[AnswerResult, float]: ...

    def close(self) -> None: ...


EngineFactory = Callable[[ReuseRuntime, int], Engine]


def baseline_module(commit: str) -> ModuleType:
    """`worker/engine.py` as it was at `commit`, imported as its own module (it imports the
    rest of the product from this tree)."""
    source = subprocess.run(["git", "show", f"{commit}:worker/engine.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_engine.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_engine", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _factory(module: ModuleType, **options: Any) -> EngineFactory:
    def make(rt: ReuseRuntime, slots: int) -> Engine:
        engine: Engine = module.AnswerEngine(lambda: rt, max_active=slots,
                                             max_kv_tokens=1 << 20, queue_wait_s=3600.0,
                                             **options)
        return engine
    return make


class Workload:
    """The pages, and questions over two of them."""

    def __init__(self, rt: ReuseRuntime, policy: PolicyChoice, budget: float) -> None:
        kvs = rt.prefill_pages([a4_page(i) for i in range(PAGES)])
        self.pages = [PageInput(page_label("report.pdf", i + 1), kv) for i, kv in enumerate(kvs)]
        self.policy, self.budget = policy, budget

    def request(self, i: int, j: int, max_new_tokens: int) -> AnswerRequest:
        chosen = [self.pages[(i + j) % PAGES], self.pages[(i + j + 1) % PAGES]]
        return AnswerRequest(ANSWER_PREFIX, chosen,
                             f"What is the total amount due on invoice {i}-{j}, and who signed it?",
                             policy=self.policy, budget=self.budget,
                             max_new_tokens=max_new_tokens)


def _ask_all(engine: Engine, requests: list[AnswerRequest],
             on_token: Sequence[Callable[[int, str], None] | None]) -> list[threading.Thread]:
    threads = [threading.Thread(target=engine.answer, args=(r, cb))
               for r, cb in zip(requests, on_token, strict=True)]
    for t in threads:
        t.start()
    return threads


def _engine_seconds() -> dict[str, tuple[float, float]]:
    """(sum of seconds, count) of the engine's decode steps and of each prefill phase so far
    (both engines export into `worker.engine_metrics`)."""
    get = REGISTRY.get_sample_value
    out = {"decode step": (get("conduit_engine_step_seconds_sum") or 0.0,
                           get("conduit_engine_step_seconds_count") or 0.0)}
    for phase in (*PREFILL_PHASES, *GROUP_PHASES):
        labels = {"phase": phase}
        out[phase] = (get("conduit_engine_prefill_phase_seconds_sum", labels) or 0.0,
                      get("conduit_engine_prefill_phase_seconds_count", labels) or 0.0)
    return out


def arrivals(make: EngineFactory, rt: ReuseRuntime, work: Workload, *, running: int,
             arriving: int, slots: int, running_tokens: int, arriving_tokens: int
             ) -> dict[str, Any]:
    """One trial: every token's time and stream, in the engine's order (streams 0..running-1
    run from the start, the others arrive together), cut into its parts (`trial_gaps`)."""
    engine = make(rt, slots)
    log: list[tuple[float, int]] = []  # token callbacks run on the engine's one thread
    counts = [0] * (running + arriving)

    def stamp(i: int) -> Callable[[int, str], None]:
        def cb(_tok: int, _piece: str) -> None:
            log.append((time.perf_counter(), i))
            counts[i] += 1
        return cb

    try:
        before = _engine_seconds()
        runners = _ask_all(engine, [work.request(i, 0, running_tokens) for i in range(running)],
                           [stamp(i) for i in range(running)])
        while min(counts[:running]) < STEADY_TOKENS:
            if not all(t.is_alive() for t in runners):
                raise RuntimeError("a running answer ended before the newcomers came")
            time.sleep(0.002)
        submitted = time.perf_counter()
        newcomers = [work.request(running + i, 1, arriving_tokens) for i in range(arriving)]
        late = _ask_all(engine, newcomers, [stamp(running + k) for k in range(arriving)])
        for t in [*late, *runners]:
            t.join()
    finally:
        engine.close()
    spent = {k: (v[0] - before[k][0], v[1] - before[k][1]) for k, v in _engine_seconds().items()}
    return {**trial_gaps(log, running, submitted), "seconds": spent}


def decode_steps(log: list[tuple[float, int]]) -> list[list[tuple[float, int]]]:
    """`log`'s tokens grouped by decode step: a step gives each of its streams one token, so
    a stream seen again opens the next step (the running answers are in every step)."""
    steps: list[list[tuple[float, int]]] = []
    seen: set[int] = set()
    for t, stream in log:
        if not steps or stream in seen:
            steps.append([])
            seen = set()
        steps[-1].append((t, stream))
        seen.add(stream)
    return steps


def trial_gaps(log: list[tuple[float, int]], running: int, submitted: float
               ) -> dict[str, Any]:
    """The running answers' gaps of one trial, each with the size of the decode step that
    ended it: `steady` (all of them decoding, before the newcomers were submitted), `during`
    (ending after the submission, starting before the last newcomer's first token) and
    `after` (from then on: decode steps only, the batch shrinking as the newcomers end); and
    the newcomers' times to first token."""
    firsts: dict[int, float] = {}
    for t, stream in log:
        if stream >= running:
            firsts.setdefault(stream, t)
    last_first = max(firsts.values())
    previous: dict[int, float] = {}
    steady_from = max(next(t for t, s in log if s == i) for i in range(running))
    parts: dict[str, list[tuple[float, int]]] = {"steady": [], "during": [], "after": []}
    for step in decode_steps(log):
        for t, stream in step:
            a = previous.get(stream)
            previous[stream] = t
            if stream >= running or a is None:
                continue
            gap = (t - a, len(step))
            if a >= steady_from and t <= submitted:
                parts["steady"].append(gap)
            elif t > submitted and a < last_first:
                parts["during"].append(gap)
            elif a >= last_first:
                parts["after"].append(gap)
    if not parts["after"]:
        raise RuntimeError("the running answers ended with the last newcomer's first token: "
                           "raise --running-tokens")
    return {**parts, "ttft": sorted(t - submitted for t in firsts.values())}


def steady_by_size(gaps: list[tuple[float, int]]) -> dict[int, float]:
    """The median gap of decode-only steps, by the step's size."""
    sizes: dict[int, list[float]] = {}
    for gap, n in gaps:
        sizes.setdefault(n, []).append(gap)
    return {n: statistics.median(v) for n, v in sorted(sizes.items())}


def over_steady(during: list[tuple[float, int]], steady: dict[int, float]) -> list[float]:
    """Each gap over the steady gap of a decode step of its size (sizes without decode-only
    steps of their own read the line between their neighbours, the nearest end beyond)."""
    sizes = list(steady)
    ref = np.interp([n for _, n in during], sizes, [steady[n] for n in sizes])
    return [gap / float(r) for (gap, _), r in zip(during, ref, strict=True)]


def throughput(make: EngineFactory, rt: ReuseRuntime, work: Workload, *, slots: int,
               clients: int, warmup_s: float, duration_s: float, max_new_tokens: int
               ) -> dict[str, float]:
    """Closed-loop clients for `warmup_s` then `duration_s`: the answers that ended and the
    tokens decoded within the second span, a second; and over the whole run, the schedule's
    shape, which the machine's load does not change: answers a decode step and decode steps
    a prefill."""
    engine = make(rt, slots)
    before = _engine_seconds()
    rows_before = REGISTRY.get_sample_value("conduit_engine_batch_size_sum") or 0.0
    ended: list[float] = []
    tokens: list[float] = []  # token callbacks run on the engine's one thread
    start = time.perf_counter() + warmup_s
    stop = start + duration_s

    def client(i: int) -> None:
        j = 0
        while time.perf_counter() < stop:
            engine.answer(work.request(i, j, max_new_tokens),
                          lambda _t, _p: tokens.append(time.perf_counter()))
            ended.append(time.perf_counter())
            j += 1
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    rows = (REGISTRY.get_sample_value("conduit_engine_batch_size_sum") or 0.0) - rows_before
    after = _engine_seconds()
    steps = after["decode step"][1] - before["decode step"][1]
    prefills = after[PREFILL_PHASES[-1]][1] - before[PREFILL_PHASES[-1]][1]
    return {"answers_per_s": sum(start <= e <= stop for e in ended) / duration_s,
            "tokens_per_s": sum(start <= e <= stop for e in tokens) / duration_s,
            "rows_per_step": rows / max(steps, 1.0),
            "steps_per_prefill": steps / max(prefills, 1.0)}


def _ms(values: list[float]) -> dict[str, Any]:
    return {k: (round(1e3 * v, 1) if isinstance(v, float) else v)
            for k, v in percentiles(values).items()}


def run(*, model: str, baseline: str, repeats: int, pairs: int, running: int, arriving: int,
        slots: int, running_tokens: int, arriving_tokens: int, clients: int,
        warmup_s: float, duration_s: float, max_new_tokens: int, command: str,
        layer_group: int | None = None, share: float | None = None) -> dict[str, Any]:
    """Both engines through both measurements (module docstring)."""
    torch.set_num_threads(1)
    settings = Settings()
    share = settings.worker.prefill_share if share is None else share
    engines = {"before": _factory(baseline_module(baseline)),
               "after": _factory(product_engine, prefill_share=share)}
    group = settings.core.prefill_layer_group if layer_group is None else layer_group
    with tempfile.TemporaryDirectory() as tmp:
        vlm = load_vlm(model, device="cpu", dtype=settings.core.torch_dtype, cache_dir=Path(tmp))
        rts = {"before": ReuseRuntime(vlm), "after": ReuseRuntime(vlm, layer_group=group)}
        for rt in rts.values():
            rt.reuse.stop_ids = []  # every answer decodes its max_new_tokens tokens
        work = Workload(rts["after"], settle_policy(settings, None, PolicyOptions()),
                        settings.core.budget)
        for name, make in engines.items():  # labels cached, the decode pool grown, by both
            warm = make(rts[name], slots)
            for t in _ask_all(warm, [work.request(i, j, 4) for i in range(running + arriving)
                                     for j in range(2)], [None] * 2 * (running + arriving)):
                t.join()
            for t in _ask_all(warm, [work.request(i, 2, running_tokens)
                                     for i in range(running + arriving)],
                              [None] * (running + arriving)):
                t.join()
            warm.close()
        gaps: dict[str, dict[str, list[float]]] = {
            name: {"steady": [], "during": [], "over": [], "literal": [], "ttft": [],
                   "largest": []} for name in engines}
        spent: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
        for r in range(repeats):
            for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
                trial = arrivals(engines[name], rts[name], work, running=running,
                                 arriving=arriving,
                                 slots=slots, running_tokens=running_tokens,
                                 arriving_tokens=arriving_tokens)
                by_size = steady_by_size(trial["steady"] + trial["after"])
                g = gaps[name]
                g["steady"].extend(gap for gap, _ in trial["steady"])
                g["during"].extend(gap for gap, _ in trial["during"])
                g["over"].extend(over_steady(trial["during"], by_size))
                g["literal"].extend(gap / by_size[running] for gap, _ in trial["during"])
                g["largest"].append(by_size[max(by_size)] / by_size[running])
                g["ttft"].extend(trial["ttft"])
                for k, (total, count) in trial["seconds"].items():
                    spent[name].setdefault(k, [0.0, 0.0])
                    spent[name][k][0] += total
                    spent[name][k][1] += count
        rates: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
        for p in range(pairs):
            for name in (list(engines) if p % 2 == 0 else list(engines)[::-1]):
                rates[name].append(throughput(engines[name], rts[name], work, slots=slots,
                                              clients=clients, warmup_s=warmup_s,
                                              duration_s=duration_s,
                                              max_new_tokens=max_new_tokens))
    rows = {}
    for name in engines:
        g = gaps[name]
        over, literal = percentiles(g["over"]), percentiles(g["literal"])
        rows[name] = {"steady_gap_ms": round(1e3 * statistics.median(g["steady"]), 1),
                      "during_ms": _ms(g["during"]),
                      "over_steady": {k: round(float(over[k] or 0.0), 2)
                                      for k in ("p50", "p99", "max")},
                      "p99_over_steady": round(float(over["p99"] or 0.0), 2),
                      "p99_over_running_steady": round(float(literal["p99"] or 0.0), 2),
                      "largest_batch_over_running": round(statistics.median(g["largest"]), 2),
                      "newcomer_ttft_ms": _ms(g["ttft"]),
                      "mean_ms": {k: round(1e3 * total / max(count, 1.0), 1)
                                  for k, (total, count) in spent[name].items()},
                      "answers_per_s": [round(x["answers_per_s"], 3) for x in rates[name]],
                      "tokens_per_s": [round(x["tokens_per_s"], 1) for x in rates[name]],
                      "rows_per_step": [round(x["rows_per_step"], 2) for x in rates[name]],
                      "steps_per_prefill": [round(x["steps_per_prefill"], 2)
                                            for x in rates[name]]}
    ratios = [a["tokens_per_s"] / max(b["tokens_per_s"], 1e-9)  # each pair ran back to back
              for a, b in zip(rates["after"], rates["before"], strict=True)]
    return {"model": model, "baseline": baseline, "policy": settings.core.policy,
            "budget": settings.core.budget, "threads": 1, "repeats": repeats, "pairs": pairs,
            "layer_group": group, "prefill_share": share,
            "running": running, "arriving": arriving, "slots": slots,
            "running_tokens": running_tokens, "arriving_tokens": arriving_tokens,
            "clients": clients, "warmup_s": warmup_s, "duration_s": duration_s,
            "max_new_tokens": max_new_tokens,
            "command": command, "date": time.strftime("%Y-%m-%d"), "engines": rows,
            "tokens_per_s_after_over_before": [round(r, 3) for r in ratios],
            "throughput_after_over_before": round(statistics.median(ratios), 3)}


def markdown(doc: dict[str, Any]) -> str:
    """The two tables: gaps under arrivals, throughput."""
    lines = [f"# Streams under arrivals, and throughput: two engines side by side ({doc['date']})",
             "", f"Command: `{doc['command']}`", "",
             f"`{doc['model']}`, two pages a question, `{doc['policy']}` at {doc['budget']}, "
             f"one torch thread, on the CPU of a 2-core machine shared with other work. "
             f"`before`: `worker/engine.py` at {doc['baseline']}, each prefill pass whole; "
             f"`after`: this tree's, the scoring pass and refresh in groups of "
             f"{doc.get('layer_group', 0)} layers, a step's prefill budget "
             f"{doc.get('prefill_share')} of a decode step.", "",
             f"{doc['running']} answers decoding ({doc['running_tokens']} tokens each), "
             f"{doc['arriving']} questions arriving at once ({doc['arriving_tokens']} tokens), "
             f"{doc['slots']} slots, {doc['repeats']} trials an engine:", "",
             "| engine | steady gap ms | gaps during arrivals ms: p50 | p99 | max | each over "
             "the steady gap of its batch size: p50 | **p99** | max | p99 over the "
             f"{doc['running']}-answer steady gap | newcomers' TTFT ms: p50 | max |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in doc["engines"].items():
        d, t, o = row["during_ms"], row["newcomer_ttft_ms"], row["over_steady"]
        lines.append(f"| {name} | {row['steady_gap_ms']} | {d['p50']} | {d['p99']} | "
                     f"{d['max']} | {o['p50']}x | **{o['p99']}x** | {o['max']}x | "
                     f"{row['p99_over_running_steady']}x | {t['p50']} | {t['max']} |")
    lines += ["", "The steady gap of a batch size is the median gap between decode-only steps of "
              "that many answers in the same trial (before the arrivals, and after the last "
              "newcomer's first token as the newcomers end); one of the largest batch was "
              + ", ".join(f"{row['largest_batch_over_running']}x ({name})"
                          for name, row in doc["engines"].items())
              + f" the {doc['running']}-answer one: decode on this CPU costs in proportion to "
              "the batch, so the last column cannot fall below that whatever the prefill does."]
    kinds = list(next(iter(doc["engines"].values()))["mean_ms"])
    lines += ["", "Mean wall time of the engine's units in those trials (ms): a running answer's "
              "gap is a decode step plus the unit of prefill work run before it.", "",
              "| engine | " + " | ".join(kinds) + " |", "|---|" + "---:|" * len(kinds)]
    for name, row in doc["engines"].items():
        lines.append(f"| {name} | " + " | ".join(str(row["mean_ms"][k]) for k in kinds) + " |")
    lines += ["", f"{doc['clients']} clients, {doc['slots']} slots, {doc['duration_s']} s a run "
              f"after {doc['warmup_s']} s of the same load, "
              f"{doc['max_new_tokens']}-token answers, {doc['pairs']} runs an engine "
              "(alternating):", "", "| engine | answers/s | tokens/s | answers a decode step "
              "| decode steps a prefill |", "|---|---:|---:|---:|---:|"]
    for name, row in doc["engines"].items():
        lines.append("| " + " | ".join([name, *(", ".join(map(str, row[k])) for k in (
            "answers_per_s", "tokens_per_s", "rows_per_step", "steps_per_prefill"))]) + " |")
    lines += ["", "Tokens a second, after over before, each pair run back to back: "
              f"{', '.join(f'{r}x' for r in doc['tokens_per_s_after_over_before'])}; "
              f"median {doc['throughput_after_over_before']}x."]
    return "\n".join(lines) + "\n"


def main(*, out: Path, **kwargs: Any) -> dict[str, Any]:
    """Run, write JSON at `out` and markdown beside it, print the tables."""
    doc = run(**kwargs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    table = markdown(doc)
    out.with_suffix(".md").write_text(table)
    print(table)
    return doc
