"""The training curve of a testbed run: losses and held-out exact match per family.

Public API:
  plot_history(history_path, out_png) -> None
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_history(history_path: Path, out_png: Path, smooth: int = 50) -> None:
    """Plot `history.jsonl` (one record per step) to `out_png`."""
    rows = [json.loads(x) for x in Path(history_path).read_text().splitlines() if x.strip()]
    if not rows:
        return
    fig, (ax_loss, ax_em) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in rows]
    for key in ("answer_loss", "aux_loss"):
        vals = [r[key] for r in rows]
        mean = [sum(vals[max(0, i - smooth + 1):i + 1]) / len(vals[max(0, i - smooth + 1):i + 1])
                for i in range(len(vals))]
        ax_loss.plot(steps, mean, label=f"{key} ({smooth}-step mean)")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("cross-entropy")
    ax_loss.set_yscale("log")
    ax_loss.legend()
    evals = [r for r in rows if "heldout_em" in r]
    for fam in ("all", "reference", "split", "legend", "lookup"):
        ax_em.plot([r["step"] for r in evals], [r["heldout_em"].get(fam, 0.0) for r in evals],
                   label=fam, linewidth=2.5 if fam == "all" else 1.2)
    ax_em.set_xlabel("step")
    ax_em.set_ylabel("held-out exact match (full prefill)")
    ax_em.set_ylim(0, 1)
    ax_em.legend()
    fig.suptitle("testbed-qwen2-vl training")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
