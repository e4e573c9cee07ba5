"""CONDUIT's open design choices, tried one at a time and together on the testbed.

The paper leaves open which question rows score, whether value norms are compared across
layers as they are, how a page's relevance is pooled, and gamma. Each candidate here is
CONDUIT with one or two of those changed (`ConduitConfig`, `ScoreConfig`); `register()`
adds them to the policy registry under their names for one process, so the probe and
`conduit-lab eval answers` can run them beside the registered policies. A candidate that
wins on the development seed and holds on the final seed is registered in
`conduit_core.policies` for good; the rest stay here.

    python -m lab.testbed.variants (--weights W | --model builtin:NAME) --n 200 \
        --pages distractors --out FILE [--policies REGISTERED,...] \
        [--candidates CANDIDATE,...] [--records FILE] \
        [--label-refresh read|always|page|budget]

The candidates for a cheaper default (issue 67: the default's per-page quota, each page's
count from the scores) are in `cheaper.py` and registered here with the rest; those ending
in `_read1` recompute one label under `--label-refresh read` (`ReadLabels`), not two.

A candidate beyond those choices, from the split oracle (`results/split_oracle.md`): a split
record's key reads the value ending the page before among that page's last rows, and with
them stale it takes a neighbour's digit. `BoundaryRule` wraps a policy: where the policy's
choice starts a page (the page's first token after its opening delimiter), the last
`tokens` tokens of the page shown before it are refreshed too, inside the same budget (on
top of the wrapped policy's choice where both fit in k, as a count rule's under its cap
usually do; otherwise the wrapped policy chooses fewer, and where the boundary rows alone
exceed k, the k nearest their pages' ends) or, with `inside=False`, on top of it whatever k
(the oracle's boundary arm; compared with the wrapped policy at the budget of equal mean
FLOPs). It needs no answer, and no page numbers: the page shown before, whatever document
page it is. Its rows and its fit within k are the product's (`boundary_rows`, `within_cap`
in `conduit_core.policies.conduit_focus`): `cv_floor_30_boundary_64`, the floor rule with
four boundary rows, became the product policy `conduit_focus`, and the name now runs it; it
adds no boundary rows where the floor rule's counts reach k (diffuse attention: there it is
`conduit_per_page`), unlike `BoundaryRule` over the floor rule.

`WithoutDelimiters` wraps a CONDUIT-scored policy so that it spends none of its budget on
the pages' opening and closing delimiters (the wrapped policy's choice at a larger budget,
the delimiters dropped, the k best-scored rows kept): the testbed's choices
(`results/choices_perpage.json`) show the default refreshing about ten of a question's
twelve, and the split oracle found adding them recovers nothing.

`SecondHop` asks which stale tokens the refreshed tokens themselves read, a signal the
question rows' attention cannot give (a split record's key reads the page before, which the
question does not look at): `base` chooses `first` of the budget; a probe pass runs those
rows through the first `layers` layers (default all) over a copy of the cache, its attention
summed over heads, rows and those layers per key; the rest of the budget goes to the stale
page tokens read most. The probe is charged (`ctx.extra_flops`) as the runtime's blocked
causal attention would compute it (the probe here forms every key's logit and masks the later
ones, a lab shortcut); the refresh then recomputes the whole choice as usual.

Public API:
  CANDIDATES: dict[str, RefreshPolicy]
  BoundaryRule(base, tokens, inside=True)   a RefreshPolicy (above)
  WithoutDelimiters(base)          a RefreshPolicy (above)
  SecondHop(base, first=0.8, layers=None)   a RefreshPolicy (above)
  at_k(ctx, k) -> PolicyContext   `ctx` at the budget of k rows (the same scoring pass)
  read_mass(ctx, rows, layers) -> ((N,) attention read per key, the probe's cache copy)
  register() -> list[str]          the candidates' names, now in `POLICIES`
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

import lab.ablations  # noqa: F401 (registers the lab's policies by name)
from conduit_core.kv.kv_cache import KVCache
from conduit_core.model.flops import LMShape, rows_flops
from conduit_core.passes.layer_forward import computed_key_counts, forward_rows
from conduit_core.passes.scoring import ScoreConfig
from conduit_core.policies import conduit_focus, get_policy, register_policy
from conduit_core.policies.conduit import ConduitConfig, ConduitPolicy
from conduit_core.policies.conduit_focus import boundary_rows, within_cap
from conduit_core.policies.policy_context import PolicyContext, RefreshPolicy
from conduit_core.policies.selection import topk_positions
from conduit_core.prompt.layout import LABEL_REFRESH
from lab.ablations.conduit_adaptive import AdaptiveConduitPolicy
from lab.testbed.cheaper import CHEAPER, ReadLabels

_Q = ScoreConfig(query_rows="question")
_L = ScoreConfig(value_norm="layer")
_QL = ScoreConfig(query_rows="question", value_norm="layer")


def at_k(ctx: PolicyContext, k: int) -> PolicyContext:
    """`ctx` with the budget whose `PolicyContext.k` is `k` (the same scoring pass)."""
    labels, n_v = ctx.layout.budget_label_rows(), int(ctx.visual_rows.numel())
    return replace(ctx, budget=(k + labels) / (n_v + labels))


@dataclass(frozen=True)
class BoundaryRule:
    """`base`'s choice, with the last `tokens` tokens of the page before each page whose first
    token it chose, within `base`'s budget or on top of it (module docstring)."""

    base: RefreshPolicy
    tokens: int
    inside: bool = True

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """The rows to refresh: `base`'s choice and the boundary rows (the product's rule:
        `conduit_core.policies.conduit_focus.boundary_rows`, `within_cap`)."""
        chosen = self.base(ctx).to(torch.long).cpu()  # (k,)
        extra = boundary_rows(ctx.layout.segments, set(chosen.tolist()), self.tokens)
        if not extra or not ctx.k:
            return chosen
        if not self.inside:  # on top, whatever k
            return torch.cat([chosen, torch.tensor(extra)]).unique()  # (picked + extra,)
        return within_cap(chosen, extra, ctx.k,
                          lambda keep: self.base(at_k(ctx, keep)).to(torch.long).cpu())


@dataclass(frozen=True)
class WithoutDelimiters:
    """`base`'s choice with no page delimiter in it, as many rows as `base` would choose
    (module docstring)."""

    base: RefreshPolicy

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """`base`'s top rows that are not delimiters, at most `ctx.k` of them."""
        segments = ctx.layout.segments
        delimiters = torch.tensor([r for s in segments for r in (s.start, s.stop - 1)])
        n_v, k = int(ctx.visual_rows.numel()), ctx.k
        wanted = k
        while True:  # at most one step more per delimiter the choice held
            chosen = self.base(at_k(ctx, wanted) if wanted != k else ctx)
            kept = chosen[~torch.isin(chosen.cpu(), delimiters)]  # (<= wanted,)
            if kept.numel() >= k or wanted >= n_v:
                break
            wanted = min(n_v, wanted + k - int(kept.numel()))
        if kept.numel() <= k:
            return kept
        weighted = ctx.scores().weighted.cpu()  # (N,) the pass `base` scored with
        top = weighted[kept.cpu()].topk(k).indices  # the k best of a larger budget's choice
        return kept[top].sort().values  # (k,)


@dataclass(frozen=True)
class SecondHop:
    """`base`'s choice at `first` of the budget, then the stale page tokens those rows read
    most in a probe pass (module docstring)."""

    base: RefreshPolicy
    first: float = 0.8
    layers: int | None = None  # probe layers, from the first (None: every layer)

    def __call__(self, ctx: PolicyContext) -> torch.Tensor:
        """`base`'s rows at round(first * k), then the k - that best read stale page rows."""
        k = ctx.k
        fewer = at_k(ctx, round(self.first * k))
        chosen = self.base(fewer).to(torch.long).cpu().sort().values  # (k1,)
        ctx.extra_flops = fewer.extra_flops  # the scoring pass, if `fewer` ran it
        if chosen.numel() in (0, k):
            return chosen
        read, _ = read_mass(ctx, chosen, self.layers)  # (N,)
        rest = ctx.visual_rows[~torch.isin(ctx.visual_rows, chosen)]  # (N_v - k1,)
        more = rest[topk_positions(read[rest], k - int(chosen.numel()))]  # (k - k1,)
        return torch.cat([chosen, more]).sort().values  # (k,)


@torch.no_grad()
def read_mass(ctx: PolicyContext, rows: torch.Tensor,
              layers: int | None) -> tuple[torch.Tensor, KVCache]:
    """Attention `rows` (R,) pay each key (N,) when recomputed over the assembled cache through
    the first `layers` layers, summed over those layers, heads and rows, and the copy of the
    cache the probe ran on (its rows written); the probe is charged."""
    adapter, layout = ctx.adapter, ctx.layout
    run = range(len(adapter.layers) if layers is None else min(layers, len(adapter.layers)))
    cache = KVCache(ctx.cache.keys.clone(), ctx.cache.values.clone())
    dev_rows = rows.to(adapter.device)
    later = torch.arange(layout.n, device=adapter.device)[None, :] > dev_rows[:, None]  # (R, N)
    read = torch.zeros(layout.n, dtype=torch.float32, device=adapter.device)

    def observe(layer: int, q: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor) -> torch.Tensor:
        rep = q.shape[1] // keys.shape[1]
        keys = keys.repeat_interleave(rep, dim=1).float()  # (1, heads, N, hd)
        values = values.repeat_interleave(rep, dim=1).float()  # (1, heads, N, hd)
        logits = q.float() @ keys.transpose(-1, -2)  # (1, heads, R, N)
        logits = logits * adapter.layers[layer].self_attn.scaling
        probs = logits.masked_fill(later, float("-inf")).softmax(-1)  # (1, heads, R, N)
        read.add_(probs.sum(dim=(0, 1, 2)))
        return (probs @ values).transpose(1, 2).to(q.dtype)  # (1, R, heads, hd)

    hidden = ctx.embeds[dev_rows.to(ctx.embeds.device)].unsqueeze(0)  # (1, R, hidden)
    pos = layout.position_ids[:, rows].unsqueeze(1)  # (P, 1, R)
    forward_rows(adapter, cache, hidden, rows, pos, n_keys=layout.n, observer=observe,
                 layers=run)
    ctx.extra_flops += rows_flops(LMShape.from_config(adapter.text_config), rows,
                                  n_layers=len(run),
                                  key_counts=computed_key_counts(adapter, rows, layout.n))
    return read.cpu(), cache


CANDIDATES: dict[str, RefreshPolicy] = {
    "cv_question_rows": ConduitPolicy(ConduitConfig(score=_Q)),
    "cv_layer_norms": ConduitPolicy(ConduitConfig(score=_L)),
    "cv_question_layer": ConduitPolicy(ConduitConfig(score=_QL)),
    "cv_gamma_half": ConduitPolicy(ConduitConfig(gamma=0.5)),
    "cv_gamma_2": ConduitPolicy(ConduitConfig(gamma=2.0)),
    "cv_question_no_amp": ConduitPolicy(ConduitConfig(gamma=0.0, score=_Q)),
    # fewer scored layers: a scoring pass that may stop early
    "cv_layers_0_3": ConduitPolicy(ConduitConfig(score=ScoreConfig(layers=(0, 3)))),
    "cv_layers_0_4": ConduitPolicy(ConduitConfig(score=ScoreConfig(layers=(0, 4)))),
    # a budget per question: run at a cap (e.g. 0.2) and compare at equal mean FLOPs
    "cv_mass_30": AdaptiveConduitPolicy(mass=0.3),
    "cv_mass_50": AdaptiveConduitPolicy(mass=0.5),
    "cv_mass_70": AdaptiveConduitPolicy(mass=0.7),
    "cv_mass_90": AdaptiveConduitPolicy(mass=0.9),
    "cv_question_mass_50": AdaptiveConduitPolicy(ConduitConfig(score=_Q), mass=0.5),
    # the page boundary inside the budget: the last 2 or 4 rows of a 16-cell testbed page
    "cv_boundary_32": BoundaryRule(get_policy("conduit_per_page"), 32),
    "cv_boundary_64": BoundaryRule(get_policy("conduit_per_page"), 64),
    "cv_boundary_32_over": BoundaryRule(get_policy("conduit_per_page"), 32, inside=False),
    "cv_no_delimiters": WithoutDelimiters(get_policy("conduit_per_page")),
    # a count rule's choice and the page boundary on top, within k (issue 67, `cheaper.py`)
    "cv_adaptive_boundary_32": BoundaryRule(AdaptiveConduitPolicy(), 32),
    "cv_floor_30_boundary_64": conduit_focus.select,  # the product policy since issue 67
    # the stale tokens the refreshed ones read: 80% or 60% of the budget first, a probe pass
    "cv_second_hop_80": SecondHop(get_policy("conduit_per_page"), 0.8),
    "cv_second_hop_60": SecondHop(get_policy("conduit_per_page"), 0.6),
    "cv_second_hop_80_l2": SecondHop(get_policy("conduit_per_page"), 0.8, layers=2),
    # the default's quota, spending less where attention is concentrated (`cheaper.py`)
    **CHEAPER,
    "conduit_adaptive_read1": ReadLabels(AdaptiveConduitPolicy(), 1),  # as conduit_adaptive
}


def register() -> list[str]:
    """Register every candidate for this process; returns their names."""
    for name, policy in CANDIDATES.items():
        register_policy(name, policy)
    return list(CANDIDATES)


def main() -> None:
    """Probe the registered CONDUIT family and the candidates on one checkpoint."""
    from conduit_core.model.loader import load_vlm
    from conduit_core.model.testbed_model import MAX_IMAGE_TOKENS
    from lab import command_line
    from lab.testbed.probe import load_checkpoint_vlm, probe

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", type=Path, help="a testbed checkpoint or weights file")
    source.add_argument("--model", help="a model by name instead (builtin:small-qwen2-vl: "
                        "random weights, for what a rule does with diffuse attention)")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--first", type=int, default=0,
                    help="skip the samples before this one (to extend an earlier run)")
    ap.add_argument("--seed", type=int, default=7, help="the development seed")
    ap.add_argument("--pages", choices=["gold", "distractors"], default="distractors")
    ap.add_argument("--budgets", default="0.05,0.1,0.2")
    ap.add_argument("--policies", default="full_reuse,conduit,conduit_no_amp,raw_attention",
                    help="registered policies probed beside the candidates")
    ap.add_argument("--candidates", default=None,
                    help="comma-separated candidates to probe (default: every one; '' none)")
    ap.add_argument("--no-label-cache", dest="label_cache", action="store_false",
                    help="page labels as text rows (before 2026-12-02), not stale from the "
                    "label cache (conduit_core.label_cache)")
    ap.add_argument("--label-refresh", choices=LABEL_REFRESH, default="read",
                    help="which stale page labels a refresh recomputes (the runtime's option "
                    "and default; 'always' before 2026-12-07)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--records", type=Path, default=None,
                    help="also write every answer's score here, for `testbed paired`")
    args = ap.parse_args()
    every = register()
    candidates = every if args.candidates is None else [
        c for c in args.candidates.split(",") if c]
    unknown = sorted(set(candidates) - set(CANDIDATES))
    if unknown:
        ap.error(f"unknown candidates: {', '.join(unknown)}")
    names = [p for p in args.policies.split(",") if p] + candidates
    records: list[dict[str, object]] | None = [] if args.records else None
    vlm = load_checkpoint_vlm(args.weights) if args.weights else load_vlm(
        args.model, cache_dir=Path(tempfile.mkdtemp()), max_image_tokens=MAX_IMAGE_TOKENS)
    rows = probe(vlm, n=args.n, seed=args.seed,
                 policies=tuple(names), budgets=tuple(float(b) for b in args.budgets.split(",")),
                 pages=args.pages, label_cache=args.label_cache,
                 label_refresh=args.label_refresh, records=records, first=args.first)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"weights": str(args.weights or args.model), "n": args.n,
                                    "seed": args.seed, "first": args.first,
                                    "pages": args.pages,
                                    "label_cache": args.label_cache,
                                    "label_refresh": args.label_refresh, "rows": rows},
                                   indent=1))
    for row in rows:
        print(json.dumps(row))
    if args.records and records is not None:
        header = {"config": {"command": command_line(), "weights": str(args.weights or args.model),
                             "n": args.n, "seed": args.seed, "pages": args.pages}}
        args.records.parent.mkdir(parents=True, exist_ok=True)
        args.records.write_text("".join(json.dumps(r) + "\n" for r in [header, *records]))


if __name__ == "__main__":
    main()
