"""Launching ops a layer of the product default against `conduit_focus` and full
prefill, eager and compiled, in bf16 and float32 (issue 65's 2.0 bound).

On the narrow 28-layer model, on the accelerator's path, as `tests/core/test_op_counts.py`
(`lab.ttft.op_count.count_prefill`: the whole prefill half and its passes alone) and
`tests/core/test_compiled_launches.py` (`lab.ttft.compiled_counts.compiled_launches`: bf16,
layer bodies compiled by inductor) count them. Rows: full prefill from the cached pages;
the product default (`DEFAULT_POLICY` with its own options on a runtime with its
defaults); `conduit_focus` the same way; `conduit` on the
runtime's defaults and with label_refresh "always".
Each ratio is to full prefill's count at the same pages and dtype.

Command line: `python -m lab.ttft.default_launches [--eager-pages 2,8,32]
[--compiled-pages 2,8] [--out lab/ttft/results/default_launches.json]`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import torch

from conduit_core.policies import choose_policy
from conduit_core.policies.choice import DEFAULT_POLICY, PolicyChoice
from conduit_core.runtime import ReuseRuntime
from lab.ttft.compiled_counts import compiled_launches
from lab.ttft.op_count import NARROW_LAYERS, count_prefill, narrow_runtime

OUT = Path(__file__).parent / "results" / "default_launches.json"
# row name -> (policy, runtime label_refresh: None the runtime's default)
ROWS: dict[str, tuple[str, str | None]] = {
    "full_prefill": ("full_prefill", None),
    "default": (DEFAULT_POLICY, None),
    "focus": ("conduit_focus", None),
    "conduit": ("conduit", None),
    "conduit_always": ("conduit", "always"),
}


def _choice(name: str) -> tuple[PolicyChoice, str | None]:
    policy, refresh = ROWS[name]
    return choose_policy(policy), refresh


def measure(eager_pages: tuple[int, ...], compiled_pages: tuple[int, ...]) -> dict[str, Any]:
    """Every row's ops a layer (module docstring), by dtype, path and pages."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    try:
        for dtype in ("bfloat16", "float32"):
            pages = sorted(set(eager_pages) | (set(compiled_pages) if dtype == "bfloat16"
                                              else set()))
            rt, kvs = narrow_runtime(max(pages), dtype=getattr(torch, dtype))
            runtimes = {None: rt, "always": ReuseRuntime(rt.vlm, label_refresh="always")}
            for n in pages:
                for name in ROWS:
                    choice, refresh = _choice(name)
                    row: dict[str, Any] = {"dtype": dtype, "pages": n, "row": name}
                    if n in eager_pages:
                        count = count_prefill(runtimes[refresh], kvs[:n], choice)
                        row["whole"] = count.ops.total / NARROW_LAYERS
                        row["passes"] = count.passes / NARROW_LAYERS
                    if dtype == "bfloat16" and n in compiled_pages:
                        c = compiled_launches(runtimes[refresh], kvs[:n], choice)
                        row["compiled"] = c.total / NARROW_LAYERS
                        row["compiled_parts"] = [c.kernels / NARROW_LAYERS,
                                                 sum(c.extern.values()) / NARROW_LAYERS,
                                                 sum(c.eager.values()) / NARROW_LAYERS]
                        row["recompilations"] = c.recompilations
                    rows.append(row)
    finally:
        torch.set_num_threads(saved)
    full = {(r["dtype"], r["pages"]): r for r in rows if r["row"] == "full_prefill"}
    for r in rows:
        for key in ("whole", "passes", "compiled"):
            if key in r:
                r[f"{key}_ratio"] = r[key] / full[(r["dtype"], r["pages"])][key]
    return {"layers": NARROW_LAYERS, "rows": rows}


def _cell(r: dict[str, Any], key: str) -> str:
    return f"{r[key]:.2f} ({r[f'{key}_ratio']:.3f}x)" if key in r else ""


def markdown(doc: dict[str, Any]) -> str:
    """The rows as a table, the command first."""
    lines = ["# Launching ops a layer of the product default (narrow 28-layer model, "
             "accelerator's path, one thread)", "", f"Command: `{doc['command']}`", "",
             "Ratios to full prefill from cached pages at the same pages and dtype. Eager: "
             "the whole prefill half and its passes alone; compiled: bf16 launches with the "
             "layer bodies compiled by inductor (kernels + extern + eager). Rows: " + ", ".join(
                 f"`{k}` = {v[0]}" + (f", label_refresh {v[1]}" if v[1] else "")
                 for k, v in ROWS.items())
             + " (no options: the product's defaults).", "",
             "| dtype | pages | row | whole | passes | compiled | kernels + extern + eager |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in doc["rows"]:
        parts = " + ".join(f"{x:.2f}" for x in r.get("compiled_parts", []))
        lines.append(f"| {r['dtype']} | {r['pages']} | {r['row']} | {_cell(r, 'whole')} | "
                     f"{_cell(r, 'passes')} | {_cell(r, 'compiled')} | {parts} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring)."""
    p = argparse.ArgumentParser(prog="python -m lab.ttft.default_launches", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--eager-pages", default="2,8,32")
    p.add_argument("--compiled-pages", default="2,8")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)

    def pages(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split(",") if x.strip())

    doc = measure(pages(args.eager_pages), pages(args.compiled_pages))
    doc["command"] = shlex.join(["python", "-m", "lab.ttft.default_launches",
                                 *(sys.argv[1:] if argv is None else argv)])
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(doc))
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
