"""The TTFT benchmark end to end at a tiny size, and its GPU script's code path on CPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conduit_core.answer_types import AnswerRequest, PageInput
from conduit_core.passes import layer_forward
from conduit_core.policies import choose_policy
from conduit_core.runtime import ReuseRuntime
from lab import answering
from lab.gpu.ttft import main as gpu_main
from lab.ttft.ab import run_ab
from lab.ttft.bench import METHODS, check_budget_one, run_ttft_bench
from lab.ttft.model import bench_pages, build_bench_vlm, make_workload, page_grid

TINY = dict(model_shape="tiny", pages=2, tokens_per_page=16, question_tokens=8)
ROW_KEYS = {"method", "tier", "ttft_ms_median", "speedup", "speedup_vs_cached_vision",
            "flops_ratio_lm", "flops_ratio_total", "bound_fraction", "bound_fraction_lm"}


def _tiers() -> tuple[str, ...]:
    return ("memory", "disk", "redis") if shutil.which("redis-server") else ("memory", "disk")


def test_run_ttft_bench_tiny_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "ttft.json"
    doc = run_ttft_bench(**TINY, tiers=_tiers(), repeats=1, warmup=0, pages_sweep=[1, 2],
                         sweep_repeats=1, out=out, workdir=tmp_path)
    assert json.loads(out.read_text()) == doc
    assert out.with_suffix(".md").read_text().startswith("# TTFT")
    assert out.with_suffix(".png").stat().st_size > 10_000
    w = doc["workload"]
    assert w["pages"] == 2 and w["visual_tokens"] == 2 * (16 + 2)
    assert w["check"]["passed"] and w["check"]["budget_one_rel_diff"] <= 1e-4
    cells = {(r["method"], r["tier"]) for r in doc["rows"]}
    expected = {("full_prefill", "none")} | {
        (m.name, t) for t in _tiers() for m in METHODS if m.policy is not None}
    assert cells == expected
    for r in doc["rows"]:
        assert ROW_KEYS <= set(r)
        assert r["ttft_ms_median"] > 0 and 0 < r["flops_ratio_total"] <= 1.0 + 1e-9
        assert r["bound_fraction"] == pytest.approx(r["speedup"] * r["flops_ratio_total"])
        assert r["bound_fraction_lm"] == pytest.approx(
            r["speedup_vs_cached_vision"] * r["flops_ratio_lm"])
        assert (r["load_ms_median"] > 0) == (r["tier"] != "none")
    full = next(r for r in doc["rows"] if r["method"] == "full_prefill")
    assert full["speedup"] == 1.0 and full["flops_ratio_total"] == full["flops_ratio_lm"] == 1.0
    reuse = [r for r in doc["rows"] if r["method"] == "full_reuse"]
    cached = [r for r in doc["rows"] if r["method"] == "full_prefill_cached_vision"]
    for a, b in zip(reuse, cached, strict=True):
        assert a["flops_ratio_total"] < b["flops_ratio_total"] < 1.0
        # the language model's work: cached vision features still recompute all of it but
        # the prompt head (from the head cache)
        assert a["flops_ratio_lm"] < b["flops_ratio_lm"] < 1.0
        assert b["speedup_vs_cached_vision"] == 1.0
    sweep = doc["sweep"]
    assert {(s["pages"], s["method"]) for s in sweep} == {
        (p, m) for p in (1, 2) for m in ("full_prefill", "conduit")}
    assert all(s["peak_mb"] is not None and s["peak_mb"] >= 0 for s in sweep)


def test_the_default_spends_at_most_0_15_of_a_full_prefill_at_the_cpu_shape() -> None:
    """Issue 26's FLOPs target, as `conduit-lab bench ttft` measures it: at the CPU shape (8
    pages x 256 visual tokens, a 32-token question), CONDUIT at 10% with the runtime's
    defaults (the service's: head and label caches, the labels it reads recomputed) spends at
    most 0.15 of a full prefill's language-model FLOPs once its labels are cached (0.151
    before the scoring pass took its rows' attention from its own probabilities)."""
    torch.manual_seed(0)
    vlm = build_bench_vlm("cpu", tokens_per_page=256)
    rt = ReuseRuntime(vlm)
    work = make_workload(vlm, 8, 32)
    kvs = rt.prefill_pages(bench_pages(8, 256))
    pages = [PageInput(label, kv) for label, kv in zip(work.labels, kvs, strict=True)]
    request = AnswerRequest(work.prefix, pages, work.question,
                            policy=choose_policy("conduit"), budget=0.1,
                            max_new_tokens=1)
    first = answering.answer(rt, request)  # computes and caches the labels (charged to it)
    again = answering.answer(rt, request)
    assert again.flops_ratio_lm < first.flops_ratio_lm
    assert again.refreshed_visual_tokens == round(0.1 * again.visual_tokens)
    assert again.flops_ratio_lm <= 0.15


def test_gpu_script_runs_on_cpu_at_tiny_shape_in_bf16(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    rc = gpu_main(["--model-shape", "tiny", "--device", "cpu", "--dtype", "bfloat16",
                   "--pages", "2", "--tokens-per-page", "16", "--question-tokens", "8",
                   "--tier", "memory,disk", "--repeats", "1", "--warmup", "0",
                   "--sweep", "1,2", "--sweep-repeats", "1", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["workload"]["dtype"] == "bfloat16" and doc["workload"]["check"]["passed"]
    assert doc["workload"]["check"]["tolerance"] == 5e-2
    assert {r["tier"] for r in doc["rows"]} == {"none", "memory", "disk"}


def test_budget_one_check_fails_on_the_wrong_pages() -> None:
    vlm = build_bench_vlm("tiny", tokens_per_page=16)
    rt = ReuseRuntime(vlm)
    work = make_workload(vlm, 2, 8)
    images = bench_pages(2, 16)
    kvs = rt.prefill_pages(images)
    assert check_budget_one(rt, work, images, kvs)["passed"]
    bad = check_budget_one(rt, work, images, kvs[::-1])  # pages swapped: not the same prompt
    assert not bad["passed"] and bad["budget_one_rel_diff"] > 1e-3


def test_workload_shapes() -> None:
    vlm = build_bench_vlm("tiny", tokens_per_page=12, dtype=torch.float32)
    assert page_grid(256) == (16, 16) and page_grid(12) == (3, 4) and page_grid(7) == (1, 7)
    work = make_workload(vlm, 3, 32)
    assert len(vlm.tokenizer(work.question, add_special_tokens=False).input_ids) == 32
    assert work.labels == ["Page 1:", "Page 2:", "Page 3:"]
    kv = ReuseRuntime(vlm).prefill_pages(bench_pages(1, 12))[0]
    assert kv.num_tokens == 12 + 2  # the visual tokens and the two vision delimiters


def test_ab_variants_toggle_the_optimisations() -> None:
    doc = run_ab(model_shape="tiny", pages=2, tokens_per_page=16, question_tokens=80,
                 repeats=1, warmup=0)
    rows = {r["variant"]: r for r in doc["rows"]}
    assert set(rows) == {"full_prefill", "optimised", "no_blocked_attn", "no_stale_reuse",
                         "neither"}
    # without the reuse the prefix rows are recomputed: more FLOPs
    assert rows["no_stale_reuse"]["flops_ratio_lm"] > rows["optimised"]["flops_ratio_lm"]
    # FLOPs are charged as computed: the one-mask path attends every row to all N keys
    assert rows["neither"]["flops_ratio_lm"] > rows["no_stale_reuse"]["flops_ratio_lm"]
    assert rows["no_blocked_attn"]["flops_ratio_lm"] > rows["optimised"]["flops_ratio_lm"]
    assert layer_forward.BLOCKED_ATTENTION  # restored


def test_7b_shape_is_qwen2_5_vl_7b() -> None:
    """The GPU shape, built on the meta device: Qwen2.5-VL-7B's 8.29 B parameters."""
    vlm = build_bench_vlm("7b", tokens_per_page=256, device="meta", dtype=torch.bfloat16)
    total = sum(p.numel() for p in vlm.model.parameters())
    assert total == pytest.approx(8.292e9, rel=1e-3)
    lm = ReuseRuntime(vlm).reuse.flops.lm
    assert (lm.layers, lm.hidden, lm.heads, lm.kv_heads, lm.head_dim, lm.intermediate) == (
        28, 3584, 28, 4, 128, 18944)
