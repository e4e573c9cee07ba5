"""`conduit-lab`: the lab's command line, beside the product's `conduit`.

    conduit-lab eval retrieval|fidelity|answers|across  quality evaluations
    conduit-lab bench store|disk-load|ttft|load|load-paired|engine|gaps|retrieval-scale|
                      conversation|prefix-transfer
    conduit-lab testbed train|export|generate|probe|criteria  the trained testbed VLM
    conduit-lab demo                                  the whole product on the testbed model
    conduit-lab report results                        docs/RESULTS.md from the committed results
    conduit-lab gpu check [...]                       the GPU check (lab/gpu/gpu_check.py;
                                                      bash lab/gpu/gpu_check.sh runs it all)
    conduit-lab gpu rerotation-split [...]            a re-rotation error split up
                                                      (lab/gpu/rerotation_split.py)

Every `--out` default writes into the subject's `results/` folder under `lab/`. The parser is
built without importing torch; each command imports its subject when it runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from lab import command_line, results
from lab.answers.cli import add_across_command, add_answers_command
from lab.argtypes import floats, ints
from lab.gpu.check_args import add_arguments as add_gpu_check_arguments
from lab.testbed.cli import add_testbed_commands
from lab.ttft.args import add_arguments as add_ttft_arguments
from service.cli import run


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `conduit-lab` console script."""
    return run(_parser(), argv)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="conduit-lab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = p.add_subparsers()

    ev = sub.add_parser("eval", help="quality evaluations").add_subparsers()
    retr = ev.add_parser("retrieval", help="page retrieval recall over a folder of PDFs")
    retr.add_argument("--pdfs", type=Path, required=True)
    retr.add_argument("--questions", type=Path, required=True)
    retr.add_argument("--out", type=Path, required=True)
    retr.add_argument("--k", type=ints, default=[1, 3, 5, 10])
    retr.add_argument("--within-doc", action="store_true")
    retr.add_argument("--no-ocr", action="store_true")
    retr.add_argument("--bm25-weight", type=float, default=None,
                      help="RRF weight of BM25 (default: CONDUIT_BM25_WEIGHT)")
    retr.add_argument("--dense-weight", type=float, default=None,
                      help="RRF weight of dense (default: CONDUIT_DENSE_WEIGHT)")
    retr.add_argument("--rrf-k", type=float, default=None,
                      help="RRF constant (default: CONDUIT_RRF_K)")
    retr.set_defaults(func=_eval_retrieval)

    add_answers_command(ev)
    add_across_command(ev)

    fid = ev.add_parser("fidelity", help="refresh policies against full prefill")
    fid.add_argument("--model", default="builtin:tiny-qwen2-vl")
    fid.add_argument("--pages", type=int, default=4)
    fid.add_argument("--budgets", type=floats, default=[0.05, 0.1, 0.2])
    fid.add_argument("--policies", default="all", help="comma-separated registry names or all")
    fid.add_argument("--samples", type=int, default=8)
    fid.add_argument("--seed", type=int, default=0)
    fid.add_argument("--max-new-tokens", type=int, default=16)
    fid.add_argument("--max-image-tokens", type=int, default=None,
                     help="visual tokens per page cap (default: the loader's)")
    fid.add_argument("--out", type=Path, default=results("fidelity") / "fidelity.json")
    fid.set_defaults(func=_eval_fidelity)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers()
    store = bench.add_parser("store", help="KV store tier throughput vs raw ceilings")
    store.add_argument("--pages", type=int, default=16)
    store.add_argument("--tokens-per-page", type=int, default=256)
    store.add_argument("--redis-url", default=None)
    store.add_argument("--repeats", type=int, default=7, help="best of this many runs")
    store.add_argument("--out", type=Path, default=results("store") / "store.json")
    store.set_defaults(func=_bench_store)

    dl = bench.add_parser("disk-load", help="a question's pages from the disk tier at 7B "
                          "sizes: sequential vs parallel reads, bf16 vs int8, vs raw reads")
    dl.add_argument("--pages", type=int, default=8)
    dl.add_argument("--repeats", type=int, default=5, help="best of this many runs")
    dl.add_argument("--threads", type=int, default=4, help="threads of the raw parallel read")
    dl.add_argument("--out", type=Path, default=results("store") / "disk_load.json")
    dl.set_defaults(func=_bench_disk_load)

    over = bench.add_parser("overhead", help="launching ops a layer and host ms of a prefill "
                            "and a decode step on the narrow 28-layer model")
    over.add_argument("--pages", default="2,8,32", help="page counts, comma-separated")
    over.add_argument("--repeats", type=int, default=5)
    over.add_argument("--out", type=Path, default=results("ttft") / "overhead.json")
    over.add_argument("--compile-backend", default="inductor", choices=("inductor", "aot_eager"),
                      help="torch.compile backend of the compiled figures")
    over.set_defaults(func=_bench_overhead)

    pc = bench.add_parser("pass-compile", help="eager against compiled layer bodies of the "
                          "scoring pass and the refresh, host ms on the narrow model")
    pc.add_argument("--pages", default="2,8", help="page counts, comma-separated")
    pc.add_argument("--repeats", type=int, default=5)
    pc.add_argument("--out", type=Path, default=results("ttft") / "pass_compile.json")
    pc.set_defaults(func=_bench_pass_compile)

    conv = bench.add_parser("conversation", help="a conversation's follow-ups against its "
                            "first turn: TTFT and LM FLOPs of kept, rebuilt and new-page turns")
    conv.add_argument("--repeats", type=int, default=5)
    conv.add_argument("--turns", type=int, default=5)
    conv.add_argument("--max-new-tokens", type=int, default=64)
    conv.add_argument("--out", type=Path,
                      default=Path("lab/conversation/results/conversation.json"))
    conv.set_defaults(func=_bench_conversation)

    pt = bench.add_parser("prefix-transfer", help="a conversation prefix copied in memory "
                          "against its Redis round trip, default builtin and a 7B shape")
    pt.add_argument("--tokens", type=int, default=1862)
    pt.add_argument("--repeats", type=int, default=5)
    pt.add_argument("--out", type=Path,
                    default=Path("lab/conversation/results/prefix_transfer.json"))
    pt.set_defaults(func=_bench_prefix_transfer)

    ttft = bench.add_parser("ttft", help="time to first token of reuse vs full prefill")
    add_ttft_arguments(ttft)
    ttft.set_defaults(func=_bench_ttft)

    load = bench.add_parser("load", help="uploads and questions from C clients: throughput, "
                            "latency percentiles, TTFT, errors, /healthz, peak RSS against "
                            "the service's bound; forms and answer engines side by side")
    load.add_argument("--clients", type=ints, default=[1, 8, 32],
                      help="comma-separated client counts, one run each")
    load.add_argument("--duration", type=float, default=60.0, help="seconds per run")
    load.add_argument("--url", default=None, help="a running service (default: spawn one)")
    load.add_argument("--pid", type=int, action="append", default=[],
                      help="with --url: process ids whose peak RSS to report")
    load.add_argument("--form", default=None,
                      help="comma-separated service forms to spawn, one after the other: "
                      "embedded (one process), distributed (Redis, two Celery workers and "
                      "the API); default embedded")
    load.add_argument("--distributed", action="store_true",
                      help="the same as --form distributed (added to --form's list)")
    load.add_argument("--key", default=None, help="API key (bearer token)")
    load.add_argument("--upload-every", type=ints, default=[10],
                      help="comma-separated: every n-th request of a client is an upload "
                      "(0 = none); each value runs its own load levels against the same "
                      "service, e.g. 0,10")
    load.add_argument("--engine", default="batched",
                      help="comma-separated answer engines to run side by side: serial "
                      "(one answer at a time), batched (the default engine)")
    load.add_argument("--max-new-tokens", type=int, default=64,
                      help="answer length cap of each question (the service's default: 64)")
    load.add_argument("--top-k", type=int, default=2, help="pages retrieved per question")
    load.add_argument("--model", default=None,
                      help="CONDUIT_MODEL of the spawned services, e.g. "
                      "builtin:tiny-qwen2-vl (default: the service's default)")
    load.add_argument("--keep-logs", type=Path, default=None,
                      help="copy the spawned services' logs into this folder when they stop")
    load.add_argument("--out", type=Path, default=results("load") / "load.jsonl")
    load.add_argument("--report", type=Path, default=None,
                      help="also write markdown tables and a plot (PNG) of --out's rows "
                      "under this path stem (also when the run is stopped)")
    load.set_defaults(func=_bench_load)

    paired = bench.add_parser("load-paired", help="one client's answer latency on the serial "
                              "and batched engines, both services up at once, in pairs")
    paired.add_argument("--form", default="embedded",
                        help="comma-separated: embedded, distributed (one after the other)")
    paired.add_argument("--pairs", type=int, default=200, help="question pairs per form")
    paired.add_argument("--upload-every", type=ints, default=[0],
                        help="comma-separated: every n-th request uploads to both (0 = none)")
    paired.add_argument("--max-new-tokens", type=int, default=64)
    paired.add_argument("--top-k", type=int, default=2)
    paired.add_argument("--model", default=None, help="CONDUIT_MODEL of both services")
    paired.add_argument("--out", type=Path, default=results("load") / "paired_one_client.json")
    paired.set_defaults(func=_bench_load_paired)

    eng = bench.add_parser("engine", help="the answer engine alone in one process: "
                           "throughput by slot count and where an answer's engine time goes")
    eng.add_argument("--model", default="builtin:small-qwen2-vl")
    eng.add_argument("--slots", type=ints, default=[1, 16],
                     help="comma-separated answer slots, one level each (1 = serial)")
    eng.add_argument("--clients", type=int, default=32)
    eng.add_argument("--duration", type=float, default=40.0, help="seconds per level")
    eng.add_argument("--max-new-tokens", type=int, default=64)
    eng.add_argument("--threads", type=int, default=1, help="torch threads")
    eng.add_argument("--device", default="cpu", help="cpu or cuda[:N] (float32 on the CPU, "
                     "bfloat16 on a GPU, as the service)")
    eng.add_argument("--out", type=Path, default=results("load") / "engine_alone.json")
    eng.set_defaults(func=_bench_engine)

    gaps = bench.add_parser("gaps", help="running answers' token gaps while new questions "
                            "arrive, and throughput: this engine beside a baseline's, one process")
    gaps.add_argument("--model", default="builtin:small-qwen2-vl")
    gaps.add_argument("--baseline", default="0b5f6df~1",
                      help="git commit whose worker/engine.py is the baseline engine")
    gaps.add_argument("--repeats", type=int, default=3, help="arrival trials an engine")
    gaps.add_argument("--running", type=int, default=8, help="answers decoding")
    gaps.add_argument("--arriving", type=int, default=8, help="questions arriving at once")
    gaps.add_argument("--running-tokens", type=int, default=400)
    gaps.add_argument("--arriving-tokens", type=int, default=128)
    gaps.add_argument("--slots", type=int, default=16, help="answer slots")
    gaps.add_argument("--pairs", type=int, default=2, help="throughput runs an engine")
    gaps.add_argument("--clients", type=int, default=32)
    gaps.add_argument("--warmup", type=float, default=8.0,
                      help="seconds of load before a throughput run's window")
    gaps.add_argument("--duration", type=float, default=15.0, help="seconds a throughput run")
    gaps.add_argument("--max-new-tokens", type=int, default=64)
    gaps.add_argument("--layer-group", type=int, default=None,
                      help="decoder layers a prefill unit of the 'after' engine runs "
                      "(default: CONDUIT_PREFILL_LAYER_GROUP's; 'before' runs whole passes)")
    gaps.add_argument("--share", type=float, default=None,
                      help="the 'after' engine's prefill budget a step over its decode step "
                      "(default: CONDUIT_PREFILL_SHARE's)")
    gaps.add_argument("--out", type=Path, default=results("load") / "gaps.json")
    gaps.set_defaults(func=_bench_gaps)

    scale = bench.add_parser("retrieval-scale", help="question latency, RSS and disk of the "
                             "retrieval index vs the scan path over synthetic collections")
    scale.add_argument("--pages", type=ints, default=[1000, 10000, 100000])
    scale.add_argument("--store", default="sqlite,redis", help="sqlite, redis or both")
    scale.add_argument("--questions", type=int, default=30, help="warm questions per row")
    scale.add_argument("--inserts", type=int, default=3,
                       help="documents added one at a time, each followed by a question")
    scale.add_argument("--scan-max-pages", type=int, default=100_000,
                       help="measure the scan path only up to this many pages")
    scale.add_argument("--work", type=Path, default=None,
                       help="scratch folder (default: a temporary one, removed after)")
    scale.add_argument("--out", type=Path,
                       default=results("retrieval") / "retrieval_scale.json")
    scale.set_defaults(func=_bench_scale)

    gpu = sub.add_parser("gpu", help="checks on one CUDA GPU").add_subparsers()
    check = gpu.add_parser("check", help="the GPU check: correctness against the model's own "
                           "forward, timings with host copies, a profiler trace")
    add_gpu_check_arguments(check)
    check.set_defaults(func=_gpu_check)
    split = gpu.add_parser("rerotation-split", help="split a re-rotation error into the "
                           "vision features', the rotation's and depth's shares")
    split.add_argument("--shape", default="tiny", help="a lab.ttft.model shape")
    split.add_argument("--layers", type=int, default=None, help="cut the language model")
    split.add_argument("--vision-depth", type=int, default=None, help="cut the vision tower")
    split.add_argument("--dtype", default="float32", choices=["float32", "bfloat16",
                                                               "float16"])
    split.add_argument("--device", default="cpu")
    split.set_defaults(func=_rerotation_split)

    report = sub.add_parser("report", help="pages generated from results").add_subparsers()
    res = report.add_parser("results", help="write docs/RESULTS.md from the committed results "
                            "(lab/results_doc.py)")
    res.set_defaults(func=_report_results)

    add_testbed_commands(sub)
    return p


def _report_results(args: argparse.Namespace) -> int:
    from lab.results_doc import write

    print("wrote", write())
    return 0


def _gpu_check(args: argparse.Namespace) -> int:
    from lab.gpu.gpu_check import run as run_gpu_check

    return run_gpu_check(args, command_line())


def _rerotation_split(args: argparse.Namespace) -> int:
    from lab.gpu.rerotation_split import rerotation_split

    print(json.dumps(rerotation_split(args.shape, args.layers, args.vision_depth, args.dtype,
                                      args.device), indent=1))
    return 0


def _bench_load(args: argparse.Namespace) -> int:
    from lab.load.bench import main
    from lab.load.services import ENGINES, FORMS

    def names(text: str, allowed: Sequence[str], flag: str) -> list[str]:
        chosen = [n for n in text.split(",") if n]
        unknown = set(chosen) - set(allowed)
        if unknown:
            raise SystemExit(f"unknown {flag} {', '.join(sorted(unknown))}: "
                             f"{' or '.join(allowed)}")
        return chosen

    engines = names(args.engine, list(ENGINES), "--engine")
    forms = names(args.form, FORMS, "--form") if args.form else []
    if args.distributed and "distributed" not in forms:
        forms.append("distributed")
    try:
        main(url=args.url, clients=args.clients, duration_s=args.duration, pids=args.pid,
             key=args.key, out=args.out, upload_every=args.upload_every,
             forms=forms or ["embedded"], engines=engines, max_new_tokens=args.max_new_tokens,
             top_k=args.top_k, model=args.model, keep_logs=args.keep_logs)
    finally:  # rows so far, also when stopped (SIGTERM) or failed
        if args.report is not None and args.out.exists():
            from lab.load.report import write_report

            print("wrote", *write_report(args.out, args.report))
    return 0


def _bench_load_paired(args: argparse.Namespace) -> int:
    from lab.load.paired import main
    from lab.load.services import FORMS

    forms = [f for f in args.form.split(",") if f]
    if not forms or set(forms) - set(FORMS):
        raise SystemExit(f"--form takes {' or '.join(FORMS)}, comma-separated")
    if args.pairs < 1:
        raise SystemExit("--pairs must be >= 1")
    main(forms=forms, pairs=args.pairs, upload_every=args.upload_every,
         max_new_tokens=args.max_new_tokens, top_k=args.top_k, model=args.model, out=args.out)
    return 0


def _bench_engine(args: argparse.Namespace) -> int:
    from lab.load.engine import main as engine_main

    if min(args.slots) < 1 or args.clients < 1 or args.duration <= 0:
        raise SystemExit("--slots and --clients must be >= 1 and --duration > 0")
    engine_main(model=args.model, slots=args.slots, clients=args.clients,
                duration_s=args.duration, max_new_tokens=args.max_new_tokens,
                threads=args.threads, out=args.out, command=command_line(),
                device=args.device)
    return 0


def _bench_gaps(args: argparse.Namespace) -> int:
    from lab.load.gaps import main as gaps_main

    if min(args.repeats, args.pairs, args.running, args.arriving, args.slots,
           args.clients) < 1 or args.duration <= 0 or args.warmup < 0:
        raise SystemExit("counts must be >= 1 and --duration > 0")
    gaps_main(model=args.model, baseline=args.baseline, repeats=args.repeats,
              pairs=args.pairs, running=args.running, arriving=args.arriving,
              slots=args.slots, running_tokens=args.running_tokens,
              arriving_tokens=args.arriving_tokens, clients=args.clients,
              warmup_s=args.warmup, duration_s=args.duration,
              max_new_tokens=args.max_new_tokens, layer_group=args.layer_group,
              share=args.share,
              out=args.out, command=command_line())
    return 0


def _bench_pass_compile(args: argparse.Namespace) -> int:
    from lab.ttft.pass_compile import run_pass_compile

    pages = [int(x) for x in args.pages.split(",") if x.strip()]
    run_pass_compile(pages, args.repeats, args.out, command=command_line())
    print(args.out.with_suffix(".md").read_text())
    return 0


def _bench_overhead(args: argparse.Namespace) -> int:
    from lab.ttft.overhead import run_overhead

    pages = [int(x) for x in args.pages.split(",") if x.strip()]
    run_overhead(pages, args.repeats, args.out, command=command_line(),
                 compile_backend=args.compile_backend)
    print(args.out.with_suffix(".md").read_text())
    return 0


def _bench_conversation(args: argparse.Namespace) -> int:
    from lab.conversation.bench import run, write

    write(run(args.repeats, args.turns, args.max_new_tokens, command_line()), args.out)
    print(args.out.with_suffix(".md").read_text())
    return 0


def _bench_prefix_transfer(args: argparse.Namespace) -> int:
    from lab.conversation.prefix_transfer import run, write

    write(run(args.tokens, args.repeats, command_line()), args.out)
    print(args.out.with_suffix(".md").read_text())
    return 0


def _bench_ttft(args: argparse.Namespace) -> int:
    from lab.ttft.bench import run_from_args

    run_from_args(args, command_line())
    return 0


def _bench_store(args: argparse.Namespace) -> int:
    from lab.store.bench import run_store_bench

    run_store_bench(pages=args.pages, tokens_per_page=args.tokens_per_page,
                    redis_url=args.redis_url, out=args.out, repeats=args.repeats)
    return 0


def _bench_disk_load(args: argparse.Namespace) -> int:
    from lab.store.disk_load import run_disk_load, to_markdown

    print(to_markdown(run_disk_load(pages=args.pages, repeats=args.repeats,
                                    threads=args.threads, out=args.out,
                                    command=command_line())))
    return 0


def _bench_scale(args: argparse.Namespace) -> int:
    from lab.retrieval.scale import run_retrieval_scale

    stores = [s for s in args.store.split(",") if s]
    run_retrieval_scale(pages=args.pages, stores=stores, questions=args.questions,
                        inserts=args.inserts, work=args.work, out=args.out,
                        scan_max_pages=args.scan_max_pages, command=command_line())
    return 0


def _eval_retrieval(args: argparse.Namespace) -> int:
    """Rank with the deployment's retrieval settings unless flags override them."""
    from lab.retrieval.evaluate import run_retrieval_eval
    from worker.settings import Settings

    s = Settings()

    def pick(flag: float | None, setting: float) -> float:
        return setting if flag is None else flag

    summary = run_retrieval_eval(args.pdfs, args.questions, args.out, ks=args.k,
                                 within_doc=args.within_doc, ocr=not args.no_ocr,
                                 bm25_weight=pick(args.bm25_weight, s.worker.bm25_weight),
                                 dense_weight=pick(args.dense_weight, s.worker.dense_weight),
                                 rrf_k=pick(args.rrf_k, s.worker.rrf_k),
                                 ref_weight=s.worker.ref_weight,
                                 clean_query=s.worker.clean_queries)
    print(json.dumps(summary, indent=2))
    return 0


def _eval_fidelity(args: argparse.Namespace) -> int:
    from lab.fidelity.evaluate import out_path_summary, run_fidelity_eval
    from worker.settings import Settings

    policies = "all" if args.policies == "all" else args.policies.split(",")
    doc = run_fidelity_eval(model=args.model, pages=args.pages, budgets=args.budgets,
                            policies=policies, samples=args.samples, out=args.out,
                            seed=args.seed, cache_dir=Settings().model_cache_dir,
                            max_new_tokens=args.max_new_tokens,
                            max_image_tokens=args.max_image_tokens, command=command_line())
    print(out_path_summary(doc, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
