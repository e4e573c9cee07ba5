"""The configuration of one `conduit-lab eval answers` run (`lab.answers.runner` runs it).

Public API:
  AnswerEvalConfig(pdfs, questions, out, model=..., device="cpu", dtype="auto",
                   policies="all", budgets=(0.05, 0.1, 0.2), pages="gold", top_k=3,
                   max_pages=8, limit=None, docs=None, max_new_tokens=32, max_page_tokens=None,
                   work_dir=None, check_budget_one=False, progress=True, command="")
  PAGES_MODES = ("gold", "retrieved", "shown")
  resolve_policies(spec) -> list[str]
  check_config(config) -> None   (ValueError)
  eval_settings(config, home) -> Settings
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from conduit_core.policies import POLICIES
from lab.answers.results import REFERENCE
from worker.settings import Settings

PAGES_MODES = ("gold", "retrieved", "shown")


@dataclass(frozen=True)
class AnswerEvalConfig:
    """Everything one evaluation run needs (see the module docstring)."""

    pdfs: Path
    questions: Sequence[Path]
    out: Path
    model: str = "builtin:tiny-qwen2-vl"
    device: str = "cpu"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    policies: str | Sequence[str] = "all"
    budgets: Sequence[float] = (0.05, 0.1, 0.2)
    pages: Literal["gold", "retrieved", "shown"] = "gold"
    top_k: int = 3
    max_pages: int = 8
    limit: int | None = None
    docs: int | None = None  # only the questions of the first N documents (question order)
    max_new_tokens: int = 32
    max_page_tokens: int | None = None
    work_dir: Path | None = None
    check_budget_one: bool = False
    progress: bool = True
    command: str = ""
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # recorded in meta as given


def resolve_policies(spec: str | Sequence[str]) -> list[str]:
    """'all' (every registered policy; full_prefill is the reference row) or names."""
    if isinstance(spec, str):
        spec = [p for p in POLICIES] if spec == "all" else [p.strip() for p in spec.split(",")]
    names = [p for p in dict.fromkeys(spec) if p]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none given)'}; known: "
                         f"{', '.join(sorted(POLICIES))}")
    return [p for p in names if p != REFERENCE]


def check_config(cfg: AnswerEvalConfig) -> None:
    """ValueError for a configuration the run cannot use."""
    if cfg.pages not in PAGES_MODES:
        raise ValueError(f"pages must be one of {', '.join(PAGES_MODES)}, got {cfg.pages!r}")
    if not cfg.budgets or any(not 0.0 <= b <= 1.0 for b in cfg.budgets):
        raise ValueError(f"budgets must be in [0, 1], got {list(cfg.budgets)}")
    for name in ("top_k", "max_pages", "max_new_tokens"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    for name in ("limit", "docs"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if not cfg.pdfs.is_dir():
        raise ValueError(f"--pdfs {cfg.pdfs} is not a folder")


def eval_settings(cfg: AnswerEvalConfig, home: Path) -> Settings:
    """The service settings the evaluation's own home runs with."""
    gold = cfg.pages != "retrieved"  # gold and shown: no OCR, pages prefilled on first use
    extra: dict[str, Any] = {"ocr": False} if gold else {}
    if cfg.max_page_tokens is not None:
        extra["max_page_tokens"] = cfg.max_page_tokens
    return Settings(home=home, model=cfg.model, device=cfg.device, dtype=cfg.dtype,
                    redis_url=None, prefill_on_ingest=not gold, **extra)
