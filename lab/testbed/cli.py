"""`conduit-lab testbed train|export|generate|probe|criteria|paired|kv-int8` and
`conduit-lab demo`: the trained testbed model."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_testbed_commands(sub: Any) -> None:
    """Register `testbed` and its subcommands on the top-level subparsers."""
    tb = sub.add_parser("testbed", help="the trained testbed VLM: train it, generate its task")
    tsub = tb.add_subparsers()

    tr = tsub.add_parser("train", help="train the testbed Qwen2-VL (resumable)")
    tr.add_argument("--out", type=Path, default=Path("testbed-run"),
                    help="run folder: checkpoints, history.jsonl, model.safetensors")
    tr.add_argument("--steps", type=int, default=4000, help="learning-rate schedule length")
    tr.add_argument("--stop-at", type=int, default=None,
                    help="stop at this step of the schedule (checkpoint and weights written)")
    tr.add_argument("--init", type=Path, default=None,
                    help="curriculum: start from these weights (checkpoint or weights file); "
                    "its vision tower is kept frozen")
    tr.add_argument("--batch-size", type=int, default=16)
    tr.add_argument("--lr", type=float, default=2e-3)
    tr.add_argument("--warmup", type=int, default=200)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    tr.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    tr.add_argument("--eval-every", type=int, default=250)
    tr.add_argument("--glyph-layer", type=int, default=0,
                    help="every cell names its glyph after this layer (-1: off)")
    tr.add_argument("--resume", action="store_true", help="continue from the run folder")
    tr.add_argument("--pair-share", type=float, default=None,
                    help="share of pair questions in training (default: uniform, 1 in 5)")
    tr.add_argument("--resolve-weight", type=float, default=0.0,
                    help="weight of key cells naming their resolved value before the layer "
                         "a question reads them (0: off, as in stages 1-3)")
    tr.set_defaults(func=_train)

    ex = tsub.add_parser("export", help="write a run's model tensors where "
                         "builtin:testbed-qwen2-vl reads them (float16 by default)")
    ex.add_argument("source", type=Path,
                    help="RUN/checkpoint.safetensors or RUN/model.safetensors")
    ex.add_argument("--out", type=Path, default=None,
                    help="default: conduit_core/weights/testbed-qwen2-vl.safetensors")
    ex.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    ex.add_argument("--folder", type=Path, default=None,
                    help="write a model folder there instead (config, weights, tokenizer, "
                         "processor) for `--model FOLDER --max-page-tokens 256`: another "
                         "checkpoint of the recipe, served or evaluated as the builtin is")
    ex.set_defaults(func=_export)

    gen = tsub.add_parser("generate", help="write PDFs and questions.jsonl of the testbed task")
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--n", type=int, required=True, help="questions (5 per document)")
    gen.add_argument("--seed", type=int, default=1)
    gen.set_defaults(func=_generate)

    pr = tsub.add_parser("probe", help="in-process accuracy per family and policy (no PDFs)")
    pr.add_argument("--weights", type=Path, default=None,
                    help="checkpoint or weights file (default: the committed weights)")
    pr.add_argument("--n", type=int, default=200)
    pr.add_argument("--seed", type=int, default=7)
    pr.add_argument("--policies", default="full_reuse,conduit,random")
    pr.add_argument("--budgets", default="0.1")
    pr.add_argument("--pages", choices=["gold", "distractors"], default="gold",
                    help="the question's evidence pages, or them plus distractor pages of the "
                    "same document (6 pages in all, in document order)")
    pr.add_argument("--records", type=Path, default=None,
                    help="also write every question's score per policy here (JSON lines, as "
                    "`eval answers` writes X.records.jsonl), for `testbed paired`")
    pr.set_defaults(func=_probe)

    cr = tsub.add_parser("criteria", help="issue 28's criteria on final `eval answers` tables, "
                         "one column per checkpoint")
    cr.add_argument("runs", type=Path, nargs="+", help="`eval answers` result JSON files")
    cr.add_argument("--policy", default=None, help="default: CONDUIT_POLICY")
    cr.add_argument("--budget", type=float, default=0.1)
    cr.add_argument("--slack", type=float, default=0.0,
                    help="taken off each accuracy threshold (0.02: the issue's 'within 2 points' "
                    "for the other checkpoints)")
    cr.add_argument("--intervals", action="store_true",
                    help="95%% paired bootstrap intervals from each table's .records.jsonl "
                    "(written beside it by `eval answers`)")
    cr.add_argument("--out", type=Path, default=None, help="also write the table here")
    cr.set_defaults(func=_criteria)

    pa = tsub.add_parser("paired", help="one policy against full prefill and the other "
                         "policies, per checkpoint and pooled, with paired intervals")
    pa.add_argument("records", type=Path, nargs="+",
                    help="per-question records, one file per checkpoint (`testbed probe "
                    "--records`, or the X.records.jsonl `eval answers` writes)")
    pa.add_argument("--policy", default=None, help="default: CONDUIT_POLICY")
    pa.add_argument("--budget", type=float, default=0.1)
    pa.add_argument("--out", type=Path, default=None, help="also write the table here")
    pa.set_defaults(func=_paired)

    ki = tsub.add_parser("kv-int8", help="every product policy's answers over int8 against "
                         "float page KV, paired (resumable)")
    ki.add_argument("--weights", type=Path, default=None,
                    help="checkpoint or weights file (default: the committed weights)")
    ki.add_argument("--n", type=int, default=300)
    ki.add_argument("--seed", type=int, default=31,
                    help="probe seed (31: drawn by neither training nor development)")
    ki.add_argument("--budget", type=float, default=0.1)
    ki.add_argument("--policies", default="", help="default: every product policy")
    ki.add_argument("--records", type=Path, required=True,
                    help="per-answer records, appended; questions already there are skipped")
    ki.add_argument("--out", type=Path, required=True, help="X.json; X.md written beside it")
    ki.set_defaults(func=_kv_int8)

    demo = sub.add_parser("demo", help="the whole product on the trained testbed model: upload, "
                          "ask each task family with CONDUIT and full reuse, compare")
    demo.add_argument("--url", default="http://127.0.0.1:8000",
                      help="a running service on builtin:testbed-qwen2-vl (else one is started)")
    demo.add_argument("--docs", type=int, default=2, help="generated PDFs (5 questions each)")
    demo.add_argument("--seed", type=int, default=5)
    demo.add_argument("--budget", type=float, default=0.1)
    demo.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from lab.testbed.demo import run_demo

    run_demo(url=args.url, n_docs=args.docs, seed=args.seed, budget=args.budget)
    return 0


def _train(args: argparse.Namespace) -> int:
    from lab.testbed.train import TrainConfig, train

    cfg = TrainConfig(out=args.out, init=args.init, steps=args.steps, stop_at=args.stop_at,
                      batch_size=args.batch_size, lr=args.lr, warmup=args.warmup, seed=args.seed,
                      device=args.device, threads=args.threads,
                      eval_every=args.eval_every, ckpt_every=args.eval_every,
                      glyph_layer=None if args.glyph_layer < 0 else args.glyph_layer,
                      pair_share=args.pair_share, resolve_weight=args.resolve_weight)
    last = train(cfg, resume=args.resume)
    print(json.dumps({"heldout_em": last, "weights": str(args.out / "model.safetensors")}))
    return 0


def _export(args: argparse.Namespace) -> int:
    import torch

    from conduit_core.model.testbed_model import WEIGHTS
    from lab.testbed.train import export_folder, export_weights

    if not args.source.is_file():
        print(f"no checkpoint at {args.source}")
        return 2
    if args.folder is not None:
        if args.out is not None:
            print("--out and --folder are exclusive")
            return 2
        export_folder(args.source, args.folder, getattr(torch, args.dtype))
        print(f"wrote the model folder {args.folder} ({args.dtype} weights, loaded as float32)")
        return 0
    out = args.out or WEIGHTS
    size = export_weights(args.source, out, getattr(torch, args.dtype))
    print(f"wrote {out} ({size / 1e6:.2f} MB, {args.dtype})")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from lab.testbed.generate import generate

    try:
        rows = generate(args.out, args.n, args.seed)
    except ValueError as exc:
        print(exc)
        return 2
    print(f"{len(rows)} questions over {len({r['doc'] for r in rows})} PDFs in {args.out}")
    return 0


def _probe(args: argparse.Namespace) -> int:
    from conduit_core.model.testbed_model import WEIGHTS
    from lab import command_line
    from lab.testbed.probe import load_checkpoint_vlm, probe

    weights = args.weights or WEIGHTS
    if not weights.is_file():
        print(f"no weights at {weights}: train with `conduit-lab testbed train` and pass --weights "
              "RUN/model.safetensors (or copy it there)")
        return 2
    try:
        vlm = load_checkpoint_vlm(weights)
    except ValueError as exc:
        print(exc)
        return 2
    records: list[dict[str, object]] | None = [] if args.records else None
    rows = probe(vlm, n=args.n, seed=args.seed,
                 policies=tuple(p for p in args.policies.split(",") if p),
                 budgets=tuple(float(b) for b in args.budgets.split(",") if b),
                 pages=args.pages, records=records)
    for row in rows:
        print(json.dumps(row))
    if args.records and records is not None:
        header = {"config": {"command": command_line(), "weights": str(weights), "n": args.n,
                             "seed": args.seed, "pages": args.pages}}
        args.records.parent.mkdir(parents=True, exist_ok=True)
        args.records.write_text("".join(json.dumps(r) + "\n" for r in [header, *records]))
    return 0


def _kv_int8(args: argparse.Namespace) -> int:
    from conduit_core.model.testbed_model import WEIGHTS
    from lab.testbed.kv_int8 import command

    args.weights = args.weights or WEIGHTS
    return command(args)


def _paired(args: argparse.Namespace) -> int:
    from lab import command_line
    from lab.testbed.intervals import read_scores
    from lab.testbed.paired import paired_table
    from worker.settings import Settings

    policy = args.policy or Settings().core.policy
    try:
        runs = {p.name.removesuffix(".jsonl").removesuffix(".records"): read_scores(p)
                for p in args.records}
        table = paired_table(runs, policy, args.budget)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot compare the records: {exc}", file=sys.stderr)
        return 2
    text = (f"`{policy}` at {args.budget:g} against full prefill and the other policies at "
            f"{args.budget:g}, on the same questions (in brackets: 95% paired bootstrap "
            f"intervals over the questions):\n\n{table}\n\nProduced by `{command_line()}`.\n")
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


def _criteria(args: argparse.Namespace) -> int:
    from lab import command_line
    from lab.testbed.criteria import markdown
    from lab.testbed.intervals import read_scores, records_beside
    from worker.settings import Settings

    policy = args.policy or Settings().core.policy
    try:
        runs = {p.stem: json.loads(p.read_text()) for p in args.runs}
        scores = ({p.stem: read_scores(records_beside(p)) for p in args.runs}
                  if args.intervals else None)
        table = markdown(runs, policy, args.slack, args.budget, scores)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot check the runs: {exc}", file=sys.stderr)
        return 2
    shown = " (in brackets: 95% paired bootstrap intervals over the questions)" \
        if args.intervals else ""
    text = (f"Issue 28's criteria, `{policy}` at {args.budget:g}, accuracy thresholds less "
            f"{args.slack:g}{shown}:\n\n{table}\n\nProduced by `{command_line()}`.\n")
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0
