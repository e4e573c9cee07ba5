"""`conduit-lab testbed train`: train the testbed Qwen2-VL, from scratch or from a checkpoint
(`init`: the page-scale curriculum, vision tower frozen), resumably.

Loss per step (lab/testbed/NOTES.md has the table and the runs that led to it): cross-entropy of
the answer tokens and the end-of-turn token after them, plus, weighted by `aux_weight`, every
key cell predicting its record's resolved value at the last layer, plus, with
`glyph_layer` (default 0), every cell naming its own glyph after that layer (weighted by
`glyph_weight`: it aligns glyph features with the text embeddings early, which is what a
question needs to find its key), plus, weighted by `hold_weight`, each lookup's key cell
naming its value after `hold_layer` (what a reference reads there) and each legend record's
key cell its row's letter (`batches._held`), plus, weighted by `resolve_weight` (0 in
stages 1-3), every key cell naming its resolved value already after layer `look_q_layer - 1`,
the residual a question reads it from (without it a legend record's digit was resolved only
in the last layer, too late to be read: `lab.testbed.legends`), plus, weighted by
`ask_weight`, each question's key token ("K" in "What is K?") predicting the answer, plus,
weighted by `look_weight`, attention supervision: head 0 of layer `look_q_layer` takes each
question's key token and its answer position to the record's key cell, and head 0 of layer
`look_p_layer` takes each key cell whose value depends on another page to the cell it needs
there (a reference's named record, the legend's digit, a split record's value:
`Document.source`), read from a tapped sdpa kernel (`lab.testbed.tap`), not eager
attention. Intermediate targets are read off through the final norm and the tied head.
Samples are drawn from `random.Random(f"{seed}:{step}")`, so a resumed run sees exactly the
data it would have seen.
Every `eval_every` steps the held-out exact match (every answer token greedy, per family, on
a fixed set drawn from another seed) is logged to `history.jsonl` and shown on the bar.
Checkpoints (`checkpoint.safetensors`: model and AdamW state; `state.json`: step and config)
are written atomically every `ckpt_every` steps, with `curve.png`; `model.safetensors` holds
the final weights. A resumed run first drops the history records written after its last
checkpoint (those steps are trained again); a fresh run into a used folder drops them all.

Public API:
  TrainConfig(out, steps, stop_at, batch_size, lr, warmup, aux_weight, glyph_layer, glyph_weight,
              hold_layer, hold_weight, resolve_weight, ask_weight, look_weight, look_q_layer,
              look_p_layer, follow_ups, pair_share, seed, device, threads, eval_every, ckpt_every,
              heldout)
  train(cfg, resume=False) -> dict    the last held-out evaluation
  model_tensors(path) -> dict        the model's tensors of a checkpoint or weights file
  export_weights(src, dst, dtype=float16) -> bytes   a checkpoint's model tensors, as shipped
  export_folder(src, folder, dtype=float16)   the same as a model folder `--model` loads
  heldout_samples(seed, shape=PAGE, n=256) -> list[Sample]   the held-out set of `--seed`
  heldout_accuracy(model, layouts, patches, samples, batch_size) -> dict[str, float]
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from conduit_core.model.adapters.qwen2_vl import Qwen2VLAdapter
from conduit_core.model.testbed_model import MAX_IMAGE_TOKENS, build_testbed
from lab.testbed.batches import (
    Batch,
    GlyphPatches,
    Layouts,
    Sample,
    batch_hidden,
    draw_sample,
    make_batch,
)
from lab.testbed.curve import plot_history
from lab.testbed.tap import Tap
from lab.testbed.task import FAMILIES, PAGE, Shape


@dataclass
class TrainConfig:
    """Training knobs; the defaults are the recipe of the run in lab/testbed/results/."""

    out: Path = Path("testbed-run")
    init: Path | None = None  # curriculum: start from these weights (a checkpoint or file)
    shape: Shape = PAGE  # page grid, pages per document, pages shown per question
    freeze_vision: bool = True  # with `init`: keep its vision tower (glyph features) as is
    steps: int = 4000  # length of the learning-rate schedule
    stop_at: int | None = None  # if set: stop (checkpoint and weights written) at this step
    batch_size: int = 16
    lr: float = 2e-3
    warmup: int = 200
    aux_weight: float = 1.0
    glyph_layer: int | None = 0  # if set: every cell names its glyph after this layer
    glyph_weight: float = 0.5
    hold_layer: int = 1  # after it, lookup and legend key cells name a row value (`_held`)
    hold_weight: float = 1.0  # that target's weight; 0 turns it off
    resolve_weight: float = 0.0  # key cells resolved after layer look_q_layer - 1; 0: off
    ask_weight: float = 1.0  # each question's key token predicts the answer (see module doc)
    look_weight: float = 1.0  # attention supervision (see module doc); 0 turns it off
    look_q_layer: int = 4  # layer whose head 0 takes a question to its record's key cell
    look_p_layer: int = 2  # layer whose head 0 takes a key cell to the cell it needs on
    #                        another page (named record, legend digit, split value)
    follow_ups: int = 2  # more questions per sample, as later chat turns
    pair_share: float | None = None  # share of pair questions (None: uniform over families)
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None  # torch.set_num_threads; None leaves torch's default
    eval_every: int = 250
    ckpt_every: int = 250
    heldout: int = 256


def _lr(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac))))


def _losses(model: Any, batch: Batch, cfg: TrainConfig, tap: Tap | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The answer loss and the weighted auxiliary losses (`tap`: the attention targets)."""
    head, norm = model.lm_head, model.model.language_model.norm
    hidden, layers = batch_hidden(model, batch, True)  # (B, N, hidden), per layer
    assert layers is not None

    def named_after(layer: int, t: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of targets `t` (batch row, index, token) read after `layer`."""
        return F.cross_entropy(head(norm(layers[layer + 1][t[:, 0], t[:, 1]])), t[:, 2])

    glyph_loss, hold_loss = torch.zeros(()), torch.zeros(())
    if cfg.glyph_layer is not None:
        glyph_loss = named_after(cfg.glyph_layer, batch.glyphs)
    if cfg.hold_weight and len(batch.held):
        hold_loss = named_after(cfg.hold_layer, batch.held)
    resolve_loss = torch.zeros(())
    if cfg.resolve_weight and len(batch.aux):
        resolve_loss = named_after(cfg.look_q_layer - 1, batch.aux)
    look_loss = torch.zeros(())
    if tap is not None:
        logs = [tap.log_probs(cfg.look_q_layer, batch.look_q)]  # (L,)
        if len(batch.look_p):
            logs.append(tap.log_probs(cfg.look_p_layer, batch.look_p))  # (R,)
        look_loss = -torch.cat(logs).clamp_min(math.log(1e-6)).mean()
    ans, aux, ask = torch.cat([batch.answer, batch.follow]), batch.aux, batch.ask
    ans_loss = F.cross_entropy(head(hidden[ans[:, 0], ans[:, 1]]), ans[:, 2])
    aux_loss = F.cross_entropy(head(hidden[aux[:, 0], aux[:, 1]]), aux[:, 2])
    ask_loss = torch.zeros(())
    if cfg.ask_weight:
        ask_loss = F.cross_entropy(head(hidden[ask[:, 0], ask[:, 1]]), ask[:, 2])
    return ans_loss, (cfg.aux_weight * aux_loss + cfg.glyph_weight * glyph_loss
                      + cfg.ask_weight * ask_loss + cfg.look_weight * look_loss
                      + cfg.hold_weight * hold_loss + cfg.resolve_weight * resolve_loss)


def heldout_samples(seed: int, shape: Shape = PAGE, n: int = 256) -> list[Sample]:
    """The held-out set a run with `seed` evaluates on (a generator no training step draws
    from)."""
    rng = random.Random(f"heldout:{seed}")
    return [draw_sample(rng, shape) for _ in range(n)]


@torch.no_grad()
def heldout_accuracy(model: Any, layouts: Layouts, patches: GlyphPatches,
                     samples: list[Sample], batch_size: int = 32) -> dict[str, float]:
    """Exact match of the greedy answer (every answer token right under teacher forcing,
    which for greedy decoding is the same), overall and per family."""
    was_training = model.training
    model.eval()
    hits: dict[str, list[bool]] = {f: [] for f in FAMILIES}
    for i in range(0, len(samples), batch_size):
        chunk = samples[i:i + batch_size]
        batch = _to(make_batch(chunk, layouts, patches), str(layouts.adapter.device))
        hidden, _ = batch_hidden(model, batch)  # (B, N, hidden)
        rows = batch.answer[~batch.answer_end]  # the answer tokens' logit rows
        pred = model.lm_head(hidden[rows[:, 0], rows[:, 1]]).argmax(-1)  # (T,)
        wrong = torch.zeros(len(chunk), dtype=torch.long).index_add_(
            0, rows[:, 0].cpu(), (pred != rows[:, 2]).long().cpu())  # (B,)
        for s, bad in zip(chunk, wrong.tolist(), strict=True):
            hits[s.question.family].append(bad == 0)
    model.train(was_training)
    out = {f: sum(h) / len(h) for f, h in hits.items() if h}
    out["all"] = sum(sum(h) for h in hits.values()) / sum(len(h) for h in hits.values())
    return out


def _save_checkpoint(out: Path, model: Any, opt: torch.optim.AdamW, step: int,
                     cfg: TrainConfig) -> None:
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()
               if k != "lm_head.weight"}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            for k, v in opt.state.get(p, {}).items():
                tensors[f"opt.{names[id(p)]}.{k}"] = torch.as_tensor(v).detach().clone()
    tmp = out / "checkpoint.safetensors.tmp"
    save_file(tensors, str(tmp))
    os.replace(tmp, out / "checkpoint.safetensors")
    state = {"step": step, "config": {k: str(v) for k, v in asdict(cfg).items()}}
    (out / "state.json.tmp").write_text(json.dumps(state, indent=1))
    os.replace(out / "state.json.tmp", out / "state.json")


def _load_checkpoint(out: Path, model: Any, opt: torch.optim.AdamW) -> int:
    tensors = load_file(str(out / "checkpoint.safetensors"))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")},
                          strict=False)
    model.tie_weights()
    params = dict(model.named_parameters())
    for key, v in tensors.items():
        if key.startswith("opt."):
            name, field = key[4:].rsplit(".", 1)
            p = params[name]  # Adam keeps `step` on the CPU, its moments beside the parameter
            opt.state[p][field] = v if field == "step" else v.to(p.device)
    return int(json.loads((out / "state.json").read_text())["step"])


def save_weights(model: Any, path: Path) -> None:
    """The model's weights alone (the tied head left out), as safetensors."""
    _write_weights(model.state_dict(), path)


def _write_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """`tensors` without the tied head, written atomically to `path`."""
    out = {k: v.detach().contiguous() for k, v in tensors.items() if k != "lm_head.weight"}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(out, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)


def model_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The model's tensors from a training checkpoint (model and optimizer state) or from a
    plain weights file."""
    tensors = load_file(str(path))
    if any(k.startswith("model.model.") for k in tensors):
        tensors = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    return tensors


def export_weights(src: Path, dst: Path, dtype: torch.dtype = torch.float16) -> int:
    """The model tensors of a run's `checkpoint.safetensors` (or of a weights file) written to
    `dst` in `dtype`, optimizer state and the tied head left out; returns the file's size.
    `build_testbed` loads them into float32 parameters."""
    _write_weights({k: v.to(dtype) for k, v in model_tensors(src).items()}, dst)
    return dst.stat().st_size


def export_folder(src: Path, folder: Path, dtype: torch.dtype = torch.float16) -> None:
    """A run's weights (as `export_weights` writes them, so in `dtype` and back) saved as a
    model folder: config, weights, tokenizer and processor, as `builtin:testbed-qwen2-vl` is
    materialised. `--model FOLDER --max-page-tokens 256` then serves or evaluates another
    checkpoint of the recipe through the loader's path for real checkpoints."""
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "weights.safetensors"
        export_weights(src, weights, dtype)
        model, processor = build_testbed(weights=weights)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)


def train(cfg: TrainConfig, resume: bool = False) -> dict[str, float]:
    """Train (or resume) into `cfg.out`; see the module docstring."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    cfg.out.mkdir(parents=True, exist_ok=True)
    model, processor = build_testbed(weights=None, seed=cfg.seed)
    if cfg.init is not None:
        model.load_state_dict(model_tensors(cfg.init), strict=False)
        model.tie_weights()
        model.model.visual.requires_grad_(not cfg.freeze_vision)
    model = model.to(cfg.device).train()  # type: ignore[arg-type]
    adapter = Qwen2VLAdapter(model, processor, processor.tokenizer, MAX_IMAGE_TOKENS)
    tap = Tap({cfg.look_q_layer, cfg.look_p_layer}) if cfg.look_weight else None
    if tap is not None:  # after the adapter: the runtime itself runs sdpa or eager only
        tap.install(model)
    patches = GlyphPatches(processor)
    layouts = Layouts(adapter, cfg.shape)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=0.01, betas=(0.9, 0.98))
    step = 0
    if resume and (cfg.out / "checkpoint.safetensors").is_file():
        step = _load_checkpoint(cfg.out, model, opt)
    _trim_history(cfg.out / "history.jsonl", step)  # a fresh run keeps no earlier records
    heldout = heldout_samples(cfg.seed, cfg.shape, cfg.heldout)
    history = (cfg.out / "history.jsonl").open("a")
    last: dict[str, float] = {}
    bar = tqdm(total=cfg.steps, initial=step, desc="testbed", dynamic_ncols=True)
    t0 = time.time()
    end = min(cfg.steps, cfg.stop_at or cfg.steps)
    while step < end:
        rng = random.Random(f"{cfg.seed}:{step}")
        shown = rng.randint(*cfg.shape.shown)  # one page count per step: no padding
        batch = make_batch([draw_sample(rng, cfg.shape, cfg.follow_ups, shown, cfg.pair_share)
                            for _ in range(cfg.batch_size)], layouts, patches)
        batch = _to(batch, cfg.device)
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step)
        ans_loss, aux_loss = _losses(model, batch, cfg, tap)
        loss = ans_loss + aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        record: dict[str, Any] = {"step": step, "loss": round(loss.item(), 4),
                  "answer_loss": round(ans_loss.item(), 4), "aux_loss": round(aux_loss.item(), 4),
                  "elapsed_s": round(time.time() - t0, 1)}
        if step % cfg.eval_every == 0 or step == end:
            last = heldout_accuracy(model, layouts, patches, heldout)
            record["heldout_em"] = {k: round(v, 4) for k, v in last.items()}
        history.write(json.dumps(record) + "\n")
        history.flush()
        bar.set_postfix(loss=f"{loss.item():.3f}", em=f"{last.get('all', 0.0):.3f}")
        bar.update(1)
        if step % cfg.ckpt_every == 0 or step == end:
            _save_checkpoint(cfg.out, model, opt, step, cfg)
            plot_history(cfg.out / "history.jsonl", cfg.out / "curve.png")
    bar.close()
    save_weights(model, cfg.out / "model.safetensors")
    return last


def _trim_history(path: Path, step: int) -> None:
    """Drop the records a stopped run wrote after its last checkpoint (they are trained
    again), and a last line cut short."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    path.write_text("".join(x + "\n" for x in kept), encoding="utf-8")


def _to(batch: Batch, device: str) -> Batch:
    if device == "cpu":
        return batch
    for name in ("ids", "position_ids", "cells", "table", "grids", "aux", "glyphs", "answer",
                 "answer_end", "follow", "ask", "look_q", "look_p", "held"):
        setattr(batch, name, getattr(batch, name).to(device))
    return batch
