"""The GPU check (lab/gpu/gpu_check.sh runs the same main) on the CPU, in float32 and in
bfloat16, and proof that it catches a wrong answer from the reuse path: a wrong re-rotation
and a refresh that lets rows see later keys both fail it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from conduit_core.kv import page_loads
from conduit_core.model.loader import load_vlm
from conduit_core.passes.row_attention import RowBlock
from conduit_core.runtime import ReuseRuntime
from lab.gpu import check_parts as parts
from lab.gpu import parity
from lab.gpu.gpu_check import PREFIX, QUESTION, _page, main
from lab.gpu.rerotation_split import rerotation_split

ROOT = Path(__file__).resolve().parents[2]
IMAGES = [_page(1, (224, 280)), _page(2, (300, 200)), _page(3, (180, 360))]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_check_passes_on_cpu(dtype: str, tmp_path: Path) -> None:
    assert main(["--device", "cpu", "--dtype", dtype, "--repeats", "1",
                 "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "check.json").read_text())
    assert doc["passed"] and doc["dtype"] == dtype
    assert doc["tolerances"] == parts.TOLERANCES[dtype]
    for model, checks in doc["correctness"].items():
        want = {"full_prefill", "rerotation", "same_layout", "one_layer", "stale_quality"}
        assert set(checks) == want | ({"device_parity"} if "bench" not in model else set())
        assert checks["rerotation"]["rel_err"] <= checks["rerotation"]["tolerance"]
        assert any(s != 0 for s in checks["rerotation"]["shifts"])
        per_layer = checks["rerotation"]["per_layer"]  # the rotation alone at layer 0
        assert len(per_layer) > 1 and max(per_layer) >= checks["rerotation"]["rel_err"]
        for name in ("same_layout", "one_layer"):
            for row in checks[name]["budgets"]:
                assert row["rel_err"] <= checks[name]["tolerance"], (model, name, row)
                if row["budget"] == 0.99:  # the scoring pass ran, some rows stayed stale
                    assert row["scored"] and row["scores_finite"]
                    assert 0 < row["refreshed"] < row["visual"]
    timings = doc["timings"]
    methods = {r["method"]: r for r in timings["rows"]}
    assert set(methods) == {"full_prefill", "conduit_0.1", "full_reuse"}
    assert all(r["ttft_ms_median"] > 0 and r["peak_mb"] > 0 for r in methods.values())
    assert methods["conduit_0.1"]["flops_ratio_lm"] < 1.0
    assert timings["decode"]["tokens_per_s"] > 0
    trace = json.loads((tmp_path / doc["profile"]["trace"]).read_text())
    assert trace["traceEvents"]
    assert "aten::" in (tmp_path / "trace_ops.txt").read_text()
    assert "| conduit_0.1 |" in (tmp_path / "check.md").read_text()


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> ReuseRuntime:
    vlm = load_vlm("builtin:tiny-qwen2-vl", cache_dir=tmp_path_factory.mktemp("m"),
                   max_image_tokens=64)
    return ReuseRuntime(vlm, never_above_full=False)


def test_a_wrong_rerotation_fails_the_check(rt: ReuseRuntime,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    real = page_loads.shift_cos_sin

    def off_by_one(adapter: Any, delta: int, device: torch.device) -> Any:
        return real(adapter, delta + 1, device)

    monkeypatch.setattr(page_loads, "shift_cos_sin", off_by_one)
    assert parts.check_full_prefill(rt, IMAGES, PREFIX, QUESTION)["passed"]  # no reuse there
    assert not parts.check_rerotation(rt, IMAGES, PREFIX, QUESTION)["passed"]
    assert not parts.check_one_layer(rt.vlm, IMAGES, PREFIX, QUESTION, [0.0, 0.1])["passed"]


def test_a_refresh_that_sees_later_keys_fails_the_check(
        rt: ReuseRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row blocks without their causal masks (rows read keys after their own)."""
    from conduit_core.passes import layer_forward

    real = layer_forward.row_blocks

    def unmasked(*args: Any, **kwargs: Any) -> list[RowBlock]:
        return [RowBlock(b.start, b.stop, b.n_keys, None) for b in real(*args, **kwargs)]

    monkeypatch.setattr(layer_forward, "row_blocks", unmasked)
    check = parts.check_same_layout(rt, IMAGES, PREFIX, QUESTION, [0.1, 0.99])
    assert not check["passed"]
    assert all(r["rel_err"] > check["tolerance"] for r in check["budgets"])


def test_0_99_runs_the_scoring_pass_that_1_0_skips(rt: ReuseRuntime) -> None:
    check = parts.check_same_layout(rt, IMAGES, PREFIX, QUESTION, [0.99, 1.0])
    at_99, at_1 = check["budgets"]
    assert check["passed"]
    assert at_99["scored"] and 0 < at_99["refreshed"] < at_99["visual"]
    assert not at_1["scored"] and at_1["refreshed"] == at_1["visual"]


def test_the_script_needs_a_gpu_or_says_how_to_run_on_the_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would run for minutes")
    env = {**os.environ, "CONDUIT_GPU_CHECK_DEVICE": "cuda"}
    done = subprocess.run(["bash", str(ROOT / "lab/gpu/gpu_check.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "CONDUIT_GPU_CHECK_DEVICE=cpu" in done.stderr


def test_the_script_runs_the_steps_asked_for(tmp_path: Path) -> None:
    """`lab/gpu/loan.sh` runs the correctness steps beside a training and the timing steps
    after it: each run of the script does the steps it is asked for and lists the others."""
    env = {**os.environ, "CONDUIT_GPU_CHECK_DEVICE": "cpu", "CONDUIT_GPU_RESULTS": str(tmp_path),
           "CONDUIT_GPU_CHECK_STEPS": "check_fp32", "CONDUIT_GPU_CHECK_DEADLINE_S": "200"}
    done = subprocess.run(["bash", str(ROOT / "lab/gpu/gpu_check.sh")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = (tmp_path / "steps.txt").read_text()
    assert "check_fp32 rc=0" in steps and "check_bf16 not asked for" in steps
    assert "tests_bf16 not asked for" in steps and "ttft not asked for" in steps
    assert json.loads((tmp_path / "check_fp32" / "check.json").read_text())["passed"]


def test_conduit_lab_gpu_check_takes_the_same_options() -> None:
    from lab.cli import _gpu_check, _parser

    args = _parser().parse_args(["gpu", "check", "--device", "cpu", "--dtype", "float32",
                                 "--skip-timings"])
    assert args.func is _gpu_check and args.device == "cpu" and args.skip_timings


def test_the_rerotation_split_finds_a_wrong_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    """In float32 every share of the split is rounding; a shift off by one position shows in
    the rotation's share (and every layer's), not in the vision features'."""
    right = rerotation_split(layers=2)
    for page in right["pages"]:
        assert max(page["vision"], page["rotation_runtime"], page["rotation_model"],
                   *page["per_layer"]) <= parts.TOLERANCES["float32"]["keys"]
    real = page_loads.shift_cos_sin
    monkeypatch.setattr(page_loads, "shift_cos_sin",
                        lambda adapter, delta, device: real(adapter, delta + 1, device))
    for page in rerotation_split(layers=2)["pages"]:
        assert page["rotation_runtime"] > 1e-2 and min(page["per_layer"]) > 1e-2
        assert page["vision"] <= parts.TOLERANCES["float32"]["keys"]


@pytest.fixture(scope="module")
def parity_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[ReuseRuntime, ReuseRuntime]:
    cache = tmp_path_factory.mktemp("parity")
    ref, dev = (ReuseRuntime(load_vlm("builtin:tiny-qwen2-vl", cache_dir=cache, dtype=dtype,
                                      max_image_tokens=64), never_above_full=False)
                for dtype in ("float32", "bfloat16"))
    return ref, dev


def test_device_parity_cpu_float32_against_cpu_bfloat16(
        parity_pair: tuple[ReuseRuntime, ReuseRuntime]) -> None:
    ref, dev = parity_pair
    check = parity.check_device_parity(ref, dev, IMAGES, PREFIX, QUESTION, [0.1, 0.99])
    assert check["passed"], check
    assert all(0 < r["refreshed"] for r in check["budgets"])


def test_device_parity_fails_when_the_device_skips_the_rerotation(
        parity_pair: tuple[ReuseRuntime, ReuseRuntime], monkeypatch: pytest.MonkeyPatch) -> None:
    ref, dev = parity_pair
    reference = parity.side(ref, IMAGES, PREFIX, QUESTION, [0.1, 0.99])
    real = page_loads.shift_cos_sin
    monkeypatch.setattr(page_loads, "shift_cos_sin",
                        lambda adapter, delta, device: real(adapter, 0, device))
    device = parity.side(dev, IMAGES, PREFIX, QUESTION, [0.1, 0.99], reference["chosen"])
    check = parity.compare(reference, device, [0.1, 0.99], "bfloat16")
    assert not check["passed"]
    assert check["budgets"][0]["rel_err"] > check["tolerance"]


def test_the_decode_rate_step_writes_its_rates(tmp_path: Path) -> None:
    from lab.gpu import decode_rate

    assert decode_rate.main(["--device", "cpu", "--model-shape", "tiny", "--pages", "2",
                             "--tokens-per-page", "16", "--new-tokens", "4", "--modes", "off",
                             "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "decode_rate.json").read_text())
    assert [r["streams"] for r in doc["rows"]] == decode_rate.STREAMS
    assert all(r["tokens_per_s"] > 0 and r["kind"] == "eager" for r in doc["rows"])
    assert doc["command"] in (tmp_path / "decode_rate.md").read_text()
