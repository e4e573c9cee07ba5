"""Options of the TTFT benchmark, importable without torch (`conduit-lab` builds its parser
from them on every start; `lab.ttft.bench` checks the names against its shapes and dtypes)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHAPE_NAMES = ["7b", "cpu", "tiny"]  # lab.ttft.model.SHAPES
DTYPE_NAMES = ["bfloat16", "float16", "float32"]  # lab.ttft.bench.DTYPES


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `conduit-lab bench ttft`."""
    p.add_argument("--model-shape", default="cpu", choices=SHAPE_NAMES)
    p.add_argument("--pages", default="8",
                   help="pages per request; a list such as 1,2,4,8,16,32 also sweeps them")
    p.add_argument("--tokens-per-page", type=int, default=256)
    p.add_argument("--question-tokens", type=int, default=32)
    p.add_argument("--tier", default="memory,disk,redis", help="comma-separated tiers")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--sweep", default="", help="page counts, e.g. 1,2,4,8,16,32")
    p.add_argument("--sweep-repeats", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--out", type=Path, default=None)


def repeats_main(module: str, doc: str | None, repeats: int, out: Path,
                 run: Callable[[int], dict[str, Any]],
                 write: Callable[[dict[str, Any], Path], None],
                 argv: list[str] | None) -> int:
    """The command line of a lab script that runs `repeats` times and writes its JSON (and
    markdown beside it) at `--out`: `python -m MODULE [--repeats N] [--out F]`; prints the
    markdown."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--out", type=Path, default=out)
    args = p.parse_args(argv)
    write(run(args.repeats), args.out)
    print(args.out.with_suffix(".md").read_text())
    return 0
