"""The prefill half of an answer, exposing what a policy chose and the logits.

Used by the policy tests and the fidelity evaluation: they compare logits, not only text.
The steps are those of `ReuseRuntime.prefill_steps` (`ReuseSteps`: assemble, policy over a
`PolicyContext`, refresh visual choice + all text rows); decoding is left out.

Only the logits a caller uses are formed: by default those of the last row (what predicts
the first answer token); `logits="all"` gives every recomputed row's (the fidelity tests
compare whole prompts), which at a 152k vocabulary is 0.6 MB per row (2.2k rows: 1.3 GB).

Public API:
  RefreshProbe(visual_rows, rows, logits, extra_flops, choice_seconds, computed_rows,
               refresh_flops)
  probe_refresh(runtime, request, last_only=False, logits="last") -> RefreshProbe
      last_only: as the answer path computes it (the last row's state only, the last
      layer trimmed for the others: `ReuseSteps.refresh`; implies logits="last")
      logits: "last" -> (1, vocab) of the last row; "all" -> (R, vocab) of every row
  probe_full_prefill(runtime, prefix, pages: list[tuple[label, image]], question,
                     logits="last") -> RefreshProbe
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import torch
from PIL import Image

from conduit_core.answer_types import AnswerRequest
from conduit_core.runtime import ReuseRuntime
from lab import answering


@dataclass(frozen=True)
class RefreshProbe:
    """One request's refreshed set and the logits of every recomputed row."""

    visual_rows: torch.Tensor  # (k,) refreshed visual sequence indices, ascending
    rows: torch.Tensor  # (R,) all recomputed sequence indices (text + visual + the stale
    # labels the refresh recomputed, when labels are stale), ascending
    logits: torch.Tensor  # (R | 1, vocab) float32, row order of `rows`; [-1] predicts token 1
    extra_flops: float  # FLOPs the policy itself spent (scoring pass, check layers)
    choice_seconds: float  # wall time of the policy's decision (incl. its scoring pass)
    computed_rows: torch.Tensor  # (R_c,) the rows the refresh computed (the rest of `rows`
    # came exact from the scoring pass: text rows before the first refreshed visual row)
    refresh_flops: float = 0.0  # FLOPs of the refresh itself (extra_flops + this = the answer's)


Rows = Literal["last", "all"]


def _logits(runtime: ReuseRuntime, hidden: torch.Tensor, rows: Rows) -> torch.Tensor:
    """Logits (R | 1, vocab) of hidden states (R, hidden): every row, or the last only."""
    if rows not in ("last", "all"):
        raise ValueError(f"logits must be 'last' or 'all', got {rows!r}")
    return runtime.reuse.logits(hidden if rows == "all" else hidden[-1:])


@torch.inference_mode()
def probe_refresh(runtime: ReuseRuntime, request: AnswerRequest,
                  last_only: bool = False, logits: Rows = "last") -> RefreshProbe:
    """Assemble `request`, let its policy choose, refresh, and return the logits."""
    policy = request.policy.select
    assembly = runtime.reuse.assemble(request.prefix, request.pages, request.question,
                                last_only=last_only)
    ctx = runtime.reuse.policy_context(assembly, request.budget, request.seed)
    t0 = time.perf_counter()
    visual = policy(ctx).to(torch.long).cpu().unique()  # (k,)
    seconds = time.perf_counter() - t0
    hidden, computed = runtime.reuse.refresh(assembly, visual, ctx.resume)  # (R, hidden), (R_c,)
    layout = assembly.layout
    rows = torch.cat([layout.text_rows(), visual, computed.cpu()]).unique()  # (R,)
    return RefreshProbe(visual_rows=visual, rows=rows, logits=_logits(runtime, hidden, logits),
                        extra_flops=ctx.extra_flops, choice_seconds=seconds,
                        computed_rows=computed,
                        refresh_flops=runtime.reuse.refresh_flops(assembly, computed, ctx.resume))


@torch.inference_mode()
def probe_full_prefill(runtime: ReuseRuntime, prefix: str,
                       pages: list[tuple[str, Image.Image]], question: str,
                       logits: Rows = "last") -> RefreshProbe:
    """The reference: every token computed now from the images (vision tower included)."""
    assembly = answering.assemble_fresh(runtime, prefix, pages, question)
    visual = assembly.layout.visual_rows()
    hidden = answering.prefill(runtime, assembly, visual)  # (N, hidden)
    rows = torch.arange(assembly.layout.n)  # (N,)
    return RefreshProbe(visual_rows=visual, rows=rows, logits=_logits(runtime, hidden, logits),
                        extra_flops=0.0, choice_seconds=0.0, computed_rows=rows)
