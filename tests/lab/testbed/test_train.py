"""Training the testbed: seeded, resumable to the same weights, safetensors only; a run started
from weights keeps their vision tower."""

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from conduit_core.model.testbed_model import build_testbed
from lab.testbed.probe import load_checkpoint_vlm
from lab.testbed.task import FAMILIES, Shape
from lab.testbed.train import TrainConfig, export_weights, model_tensors, save_weights, train

SMALL = Shape(cols=16, rows=8, pages=(6, 6), shown=(4, 4))  # 128 cells a page: fast steps


def _cfg(out, steps, **kw):
    return TrainConfig(out=out, shape=SMALL, steps=steps, batch_size=2, warmup=2, eval_every=2,
                       ckpt_every=2, heldout=4, follow_ups=1, threads=1, **kw)


def test_a_resumed_run_ends_where_a_straight_run_ends(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(_cfg(straight, 3))
    train(_cfg(resumed, 2))
    assert json.loads((resumed / "state.json").read_text())["step"] == 2
    with (resumed / "history.jsonl").open("a") as fh:  # a run stopped after its checkpoint
        fh.write(json.dumps({"step": 3, "loss": 9.0}) + '\n{"step": 4, "lo')
    last = train(_cfg(resumed, 3), resume=True)
    assert "all" in last and set(last) <= {*FAMILIES, "all"}
    a = load_file(str(straight / "model.safetensors"))
    b = load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    first = load_file(str(resumed / "checkpoint.safetensors"))
    assert any(k.startswith("opt.") and k.endswith("exp_avg") for k in first)
    steps = [json.loads(x)["step"] for x in (resumed / "history.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.bin"))
    vlm = load_checkpoint_vlm(resumed / "model.safetensors")  # the weights load back exactly
    state = vlm.model.state_dict()
    assert all(torch.equal(state[k], b[k]) for k in b)
    train(_cfg(resumed, 2))  # a fresh run into the used folder starts a fresh history
    steps = [json.loads(x)["step"] for x in (resumed / "history.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


def test_export_writes_float16_weights_the_builtin_loads(tmp_path):
    train(_cfg(tmp_path / "run", 2))
    out = tmp_path / "weights" / "testbed.safetensors"
    size = export_weights(tmp_path / "run" / "checkpoint.safetensors", out)
    shipped = load_file(str(out))
    assert size == out.stat().st_size and "lm_head.weight" not in shipped
    assert all(v.dtype == torch.float16 for v in shipped.values())
    assert not any(k.startswith(("opt.", "model.model.")) for k in shipped)
    trained = model_tensors(tmp_path / "run" / "checkpoint.safetensors")
    model, _ = build_testbed(weights=out)
    state = model.state_dict()
    for k, v in shipped.items():  # float32 parameters holding the rounded trained values
        assert state[k].dtype == torch.float32 and torch.equal(state[k], v.float())
        assert torch.allclose(state[k], trained[k], rtol=1e-3, atol=1e-4)
    assert torch.equal(state["lm_head.weight"], state["model.language_model.embed_tokens.weight"])


def test_a_run_from_weights_keeps_their_vision_tower(tmp_path):
    start = tmp_path / "start.safetensors"
    model, _ = build_testbed(weights=None, seed=5)  # not the run's own seed-0 init
    save_weights(model, start)
    train(_cfg(tmp_path / "run", 1, init=start))
    before, after = load_file(str(start)), load_file(str(tmp_path / "run" / "model.safetensors"))
    assert before.keys() == after.keys()
    vision = [k for k in before if k.startswith("model.visual.")]
    rest = [k for k in before if not k.startswith("model.visual.")]
    assert vision and rest
    assert all(torch.equal(before[k], after[k]) for k in vision)  # frozen
    assert all(not torch.equal(before[k], after[k]) for k in rest)  # one AdamW step moved them
    ckpt = load_file(str(tmp_path / "run" / "checkpoint.safetensors"))
    assert not any(k.startswith("opt.model.visual.") for k in ckpt)  # no optimizer state


def test_glyph_naming_adds_a_loss_after_the_chosen_layer(tmp_path):
    plain = train(_cfg(tmp_path / "a", 1, glyph_layer=None))
    named = train(_cfg(tmp_path / "b", 1, glyph_layer=1))
    assert set(plain) == set(named)
    loss = [json.loads((tmp_path / d / "history.jsonl").read_text())["aux_loss"]
            for d in ("a", "b")]
    assert loss[1] > loss[0] + 1.0  # every cell's glyph named from layer 1: ~ln(vocab) / 2


def test_the_resolve_target_adds_a_loss_before_the_layer_questions_read(tmp_path):
    plain = train(_cfg(tmp_path / "a", 1))
    resolved = train(_cfg(tmp_path / "b", 1, resolve_weight=1.0))
    assert set(plain) == set(resolved)
    loss = [json.loads((tmp_path / d / "history.jsonl").read_text())["aux_loss"]
            for d in ("a", "b")]
    assert loss[1] > loss[0] + 1.0  # every key cell's resolved value named after layer 3


def test_an_exported_folder_serves_as_the_builtin_does(tmp_path):
    """`conduit-lab testbed export --folder`: another checkpoint of the recipe loads through
    the loader's path for real checkpoints and computes what the builtin computes from the
    same weights (here the committed ones)."""
    from PIL import Image, ImageDraw

    from conduit_core.model.loader import load_vlm
    from conduit_core.model.testbed_model import WEIGHTS
    from conduit_core.runtime import ReuseRuntime
    from lab.testbed.train import export_folder

    export_folder(WEIGHTS, tmp_path / "folder")
    folder = load_vlm(str(tmp_path / "folder"), cache_dir=tmp_path / "c1", max_image_tokens=256)
    builtin = load_vlm("builtin:testbed-qwen2-vl", cache_dir=tmp_path / "c2")
    a, b = folder.model.state_dict(), builtin.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert folder.fingerprint.template_version == builtin.fingerprint.template_version
    page = Image.new("RGB", (448, 448), "white")
    ImageDraw.Draw(page).text((20, 20), "A 7  B 3", fill="black")
    (kv_a,), (kv_b,) = (ReuseRuntime(v).prefill_pages([page]) for v in (folder, builtin))
    assert kv_a.num_tokens == 256 + 2  # the page's cells between its vision markers
    assert torch.equal(kv_a.keys, kv_b.keys) and torch.equal(kv_a.values, kv_b.values)


def test_training_imports_none_of_the_pipelines_libraries():
    """A training process (on a GPU loan too, where these packages must be carried) lays prompts
    out as the service does without importing storage, retrieval, ingest or the web stack."""
    code = ("import sys, lab.testbed.train; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pymupdf', 'tantivy', "
            "'bm25s', 'redis', 'celery', 'fastapi', 'storage', 'service'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.stdout.strip() == "[]"
