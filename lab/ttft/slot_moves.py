"""What moving an answer that outgrew its decode slot costs (`DecodePool.move`,
`conduit_core.kv.kv_pool`), on the CPU.

`python -m lab.ttft.slot_moves` builds a random-weight Qwen2.5-VL whose KV per position is
Qwen2.5-VL-7B's (28 layers, 4 KV heads, head dim 128, bfloat16: 57 KB a position; the rest of
the model narrow, since a move touches only the KV) and a fixed pool with the default ladder's
slot sizes for 16 answers over 65,536 positions (short slots of 3,072 positions, long ones of
8,192; two short slots and one long one here, as a move's work depends on the slot sizes, not
their count). An answer of an 8 x 256-token prompt (2,150 positions) has filled its short
slot; the slot's other answer holds its prompt. Timed on one thread, median of the repeats:
* "next tier": the answer moves into the free long slot (its keys copied, the rest of the
  long slot zeroed) and the other answer takes its short slot (its keys copied, the rest
  zeroed);
* "own cache": the long slot is taken, so the answer moves to a cache of its own (allocated
  at its whole need, a 1,024-token answer, and its keys copied), the other as above.
The bytes copied and zeroed are counted from the shapes. Writes JSON and markdown (default
lab/ttft/results/slot_moves.{json,md}).
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from conduit_core.decode import DecodeState, Sampler
from conduit_core.kv.kv_cache import KVCache
from conduit_core.kv.kv_pool import DecodePool
from conduit_core.model.loader import LoadedVLM
from lab.ttft.args import repeats_main
from lab.ttft.model import SHAPES, build_bench_vlm

RESULTS = Path(__file__).parent / "results"
KV_7B = replace(SHAPES["tiny"], text={**SHAPES["tiny"].text, "num_hidden_layers": 28,
                                      "hidden_size": 512, "num_attention_heads": 4,
                                      "num_key_value_heads": 4, "mrope_section": [16, 24, 24]},
                notes="Qwen2.5-VL-7B's KV per position on a narrow model (slot moves)")
SHORT, LONG = 3072, 8192  # the default ladder's slots at 16 answers, 65,536 positions
PROMPT, ANSWER = 2150, 1024  # an 8 x 256-token question and its longest answer
CASES = ("next tier", "own cache")


def _answer(vlm: LoadedVLM, picked: int) -> DecodeState:
    """An answer of a PROMPT-position prompt with `picked` tokens out, its own cache random."""
    adapter = vlm.adapter
    cache = KVCache.allocate(adapter, 1, PROMPT + ANSWER)
    cache.keys.normal_()
    cache.values.normal_()
    state = DecodeState.start(adapter, cache, torch.zeros(8), n_keys=PROMPT,
                              next_position=PROMPT, max_new_tokens=ANSWER, sampler=Sampler(),
                              stop_ids=[], tokenizer=vlm.tokenizer)
    state.picked = picked
    return state


def _moves_ms(vlm: LoadedVLM, case: str, repeats: int) -> list[float]:
    """ms of each move of `case` (module docstring)."""
    pool = DecodePool(vlm.adapter, 2, 2 * SHORT + LONG, fixed=True,
                      tiers=[(2, SHORT), (1, LONG)])
    pool.allocate()
    blocker = _answer(vlm, 1)
    if case == "own cache":
        assert pool.tiers[1].admit(blocker, LONG)
    took = []
    for _ in range(repeats):
        full, other = _answer(vlm, 1), _answer(vlm, 1)
        assert pool.admit(full) and pool.admit(other) and full.tier == other.tier == 0
        full.picked = SHORT - PROMPT + 1  # its keys fill the slot: the next token outgrows it
        assert not pool.holds(full)
        start = time.perf_counter()
        pool.move(full)
        took.append(1e3 * (time.perf_counter() - start))
        assert (full.tier, full.slot) == ((1, 0) if case == "next tier" else (0, None))
        assert (other.tier, other.slot) == (0, 0)
        pool.release(full)
        pool.release(other)
    return took


def run(repeats: int = 7) -> dict[str, Any]:
    """Both cases' timings and bytes; see the module docstring."""
    torch.set_num_threads(1)
    vlm = build_bench_vlm("kv-7b", tokens_per_page=256, dtype=torch.bfloat16, spec=KV_7B)
    adapter = vlm.adapter
    position = (2 * len(adapter.layers) * adapter.text_config.num_key_value_heads
                * adapter.layers[0].self_attn.head_dim * 2)  # bytes of K and V, bf16
    copied = {"next tier": SHORT + PROMPT + 1, "own cache": SHORT + PROMPT + 1}
    zeroed = {"next tier": (LONG - SHORT) + (SHORT - PROMPT - 1), "own cache": SHORT - PROMPT - 1}
    cases = {}
    for case in CASES:
        took = _moves_ms(vlm, case, repeats)
        cases[case] = {"ms_median": round(statistics.median(took), 2),
                       "ms_all": [round(t, 2) for t in took],
                       "positions_copied": copied[case], "positions_zeroed": zeroed[case],
                       "bytes_copied": copied[case] * position,
                       "bytes_zeroed": zeroed[case] * position}
    return {"shape": "Qwen2.5-VL-7B KV (28 layers, 4 KV heads, head dim 128, bfloat16)",
            "bytes_a_position": position, "short_slot": SHORT, "long_slot": LONG,
            "prompt": PROMPT, "answer": ANSWER, "repeats": repeats, "threads": 1,
            "cases": cases,
            "command": shlex.join(["python", "-m", "lab.ttft.slot_moves", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%d")}


def write(doc: dict[str, Any], out: Path) -> None:
    """JSON at `out`, a markdown table beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# Moving an answer that outgrew its decode slot, CPU ({doc['date']})", "",
             f"Command: `{doc['command']}`", "",
             f"{doc['shape']}: {doc['bytes_a_position']} bytes a position. Short slots of "
             f"{doc['short_slot']} positions, long of {doc['long_slot']}; the answer's prompt "
             f"{doc['prompt']} positions, its slot full; one thread, median of "
             f"{doc['repeats']}.", "",
             "| move | ms | MB copied | MB zeroed |", "|---|---:|---:|---:|"]
    for case, r in doc["cases"].items():
        lines.append(f"| {case} | {r['ms_median']} | {r['bytes_copied'] / 1e6:.0f} | "
                     f"{r['bytes_zeroed'] / 1e6:.0f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Command line: `python -m lab.ttft.slot_moves [--repeats 7] [--out F]`."""
    return repeats_main("lab.ttft.slot_moves", __doc__, 7,
                        RESULTS / "slot_moves.json", run, write, argv)


if __name__ == "__main__":
    raise SystemExit(main())
