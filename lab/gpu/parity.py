"""The device-parity check of the GPU check: the same requests through the whole answer path on
the CPU in float32 (the reference) and on the device in its dtype.

Each side prefills the same page images, then answers the same question under a new prefix
(page keys re-rotated, labels from the label cache, the head cache) at budgets 0.1 and 0.99
through `lab.answering.start_answer`. The reference runs CONDUIT and records the visual rows it
chose; the device side replays them (a `PolicyChoice` of its own, not registered), so both
refresh the same rows and the difference is the device's arithmetic alone. Each side also runs
a full prefill of the same layout. Passed when, at every budget, the device's first-token
logits are within the device dtype's logits bound of the reference's (`check_parts.TOLERANCES`,
relative to the largest reference logit), and on the device the error against its own full
prefill at 0.99 is below that at 0.1 (the refresh moves the answer towards full prefill).

Public API:
  side(rt, images, prefix, question, budgets, chosen=None) -> dict
      first-token logits at each budget ("logits"), the full prefill's ("full"), the rows
      refreshed at each budget ("chosen"; replayed when `chosen` is given)
  compare(ref, dev, dtype) -> dict   the check's rows and `passed`
  check_device_parity(ref_rt, dev_rt, images, prefix, question, budgets) -> dict
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image

from conduit_core.policies import get_policy
from conduit_core.policies.choice import PolicyChoice, PolicyOptions
from conduit_core.policies.policy_context import PolicyContext
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.gpu.check_parts import TOLERANCES, page_labels, rel_err, request

RECORD, REPLAY = "parity_record", "parity_replay"


@torch.no_grad()
def side(rt: ReuseRuntime, images: list[Image.Image], prefix: str, question: str,
         budgets: list[float], chosen: list[torch.Tensor] | None = None) -> dict[str, Any]:
    """One side of the check (module docstring)."""
    kvs = rt.prefill_pages(images)
    conduit = get_policy("conduit")
    picked: list[torch.Tensor] = []
    logits = []
    for i, budget in enumerate(budgets):
        if chosen is None:
            def record(ctx: PolicyContext) -> torch.Tensor:
                rows: torch.Tensor = conduit(ctx)
                picked.append(rows.to(torch.long).cpu())
                return rows
            choice = PolicyChoice(RECORD, PolicyOptions(), record)
        else:
            def replay(_ctx: PolicyContext, rows: torch.Tensor = chosen[i]) -> torch.Tensor:
                return rows
            choice = PolicyChoice(REPLAY, PolicyOptions(), replay)
        state = answering.start_answer(rt, request(prefix, kvs, question, choice, budget, 1))
        logits.append(state.decode.logits.float().cpu())  # (vocab,)
        rt.release(state)
    asm = answering.assemble_fresh(rt,
        prefix, list(zip(page_labels(len(images)), images, strict=True)),
                            question)
    # (vocab,)
    full = rt.reuse.logits(answering.prefill(rt, asm, asm.layout.visual_rows()))[-1].float().cpu()
    return {"logits": logits, "full": full,
            "chosen": chosen if chosen is not None else picked[-len(budgets):]}


def compare(ref: dict[str, Any], dev: dict[str, Any], budgets: list[float],
            dtype: str) -> dict[str, Any]:
    """The parity rows and verdict of two sides (module docstring)."""
    tol = TOLERANCES[dtype]["logits"]
    rows = [{"budget": b, "refreshed": int(c.numel()), "rel_err": rel_err(d, r),
             "device_vs_full": rel_err(d, dev["full"]), "cpu_vs_full": rel_err(r, ref["full"]),
             "top1_same": bool(d.argmax() == r.argmax())}
            for b, r, d, c in zip(budgets, ref["logits"], dev["logits"], ref["chosen"],
                                  strict=True)]
    by = {r["budget"]: r for r in rows}
    closer = by[0.99]["device_vs_full"] < by[0.1]["device_vs_full"]
    within = all(r["rel_err"] <= tol for r in rows)
    return {"budgets": rows, "tolerance": tol, "closer_at_0.99": closer,
            "passed": within and closer}


def check_device_parity(ref_rt: ReuseRuntime, dev_rt: ReuseRuntime,
                        images: list[Image.Image], prefix: str, question: str,
                        budgets: list[float]) -> dict[str, Any]:
    """The reference (CPU float32) and the device side, compared (module docstring)."""
    ref = side(ref_rt, images, prefix, question, budgets)
    dev = side(dev_rt, images, prefix, question, budgets, chosen=ref["chosen"])
    dtype = str(dev_rt.adapter.dtype).removeprefix("torch.")
    return compare(ref, dev, budgets, dtype)
