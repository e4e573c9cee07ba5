"""Training the testbed: seeded, resumable to the same weights, safetensors only."""

import json

import torch
from safetensors.torch import load_file

from testbed.probe import load_checkpoint_vlm
from testbed.train import TrainConfig, train


def _cfg(out, steps):
    return TrainConfig(out=out, steps=steps, batch_size=2, warmup=2, eval_every=2,
                       ckpt_every=2, heldout=4, threads=1)


def test_a_resumed_run_ends_where_a_straight_run_ends(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(_cfg(straight, 3))
    train(_cfg(resumed, 2))
    assert json.loads((resumed / "state.json").read_text())["step"] == 2
    last = train(_cfg(resumed, 3), resume=True)
    assert "all" in last and set(last) <= {"reference", "split", "legend", "lookup", "all"}
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


def test_glyph_naming_adds_a_loss_after_the_chosen_layer(tmp_path):
    plain = train(TrainConfig(out=tmp_path / "a", steps=1, batch_size=2, heldout=4, threads=1,
                              glyph_layer=None))
    named = train(TrainConfig(out=tmp_path / "b", steps=1, batch_size=2, heldout=4, threads=1,
                              glyph_layer=1))
    assert set(plain) == set(named)
    loss = [json.loads((tmp_path / d / "history.jsonl").read_text())["aux_loss"]
            for d in ("a", "b")]
    assert loss[1] > loss[0] + 1.0  # every cell's glyph named from layer 1: ~ln(vocab) / 2
