"""Fused projections (issue 65, point 3): a loaded model's q/k/v and gate/up run as one
matmul each, their weight shared with the modules' own parameters.

For every family: each layer is fused at load, the parameters are views of the fused weight
(no second copy: the model's own forward reads the same memory), a layer's q/k/v and MLP
equal the modules' own to float rounding and issue one projection instead of three (two),
and a computation that records gradients reads the modules' parameters. End to end, the
exactness tests (tests/core/test_reuse_exactness.py, test_full_prefill.py,
tests/policies/test_families.py) run on the fused weights.
"""

from __future__ import annotations

import torch

from conduit_core.model.adapters.fused import fused_of
from conduit_core.model.loader import LoadedVLM
from lab.ttft.op_count import count_ops


def _shares(param: torch.Tensor, fused: torch.Tensor) -> bool:
    return bool(param.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr())


@torch.no_grad()
def test_every_layer_is_fused_in_the_modules_own_memory(vlm: LoadedVLM) -> None:
    for layer in vlm.adapter.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = fused_of(attn), fused_of(mlp)
        assert qkv is not None and gate_up is not None
        mods = [attn.q_proj, attn.k_proj, attn.v_proj]
        assert qkv.sizes == tuple(m.weight.shape[0] for m in mods)
        assert all(_shares(m.weight, qkv.weight) for m in mods)
        if qkv.bias is not None:
            assert all(m.bias is not None and _shares(m.bias, qkv.bias) for m in mods)
        assert all(_shares(m.weight, gate_up.weight) for m in (mlp.gate_proj, mlp.up_proj))
        assert torch.equal(qkv.weight, torch.cat([m.weight for m in mods]))


@torch.no_grad()
def test_fused_projections_equal_the_modules_and_issue_one_matmul(vlm: LoadedVLM) -> None:
    adapter = vlm.adapter
    layer = adapter.layers[0]
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1, 5, adapter.text_config.hidden_size, generator=g).to(
        adapter.device, adapter.dtype)  # (1, 5, hidden)
    attn = layer.self_attn
    (q, k, v), qkv_ops = count_ops(lambda: adapter.qkv(attn, h))
    hd = attn.head_dim
    own = [proj(h).view(1, 5, -1, hd).transpose(1, 2)
           for proj in (attn.q_proj, attn.k_proj, attn.v_proj)]  # (1, heads_i, 5, hd)
    for fused, ref in zip((q, k, v), own, strict=True):
        torch.testing.assert_close(fused, ref)
    out, mlp_ops = count_ops(lambda: adapter.mlp(layer.mlp, h))
    torch.testing.assert_close(out, layer.mlp(h))
    matmuls = {"mm", "addmm", "linear"}
    assert sum(n for name, n in qkv_ops.by_name.items() if name in matmuls) == 1, qkv_ops.by_name
    # gate and up in one matmul, then the down projection
    assert sum(n for name, n in mlp_ops.by_name.items() if name in matmuls) == 2, mlp_ops.by_name


def test_recording_gradients_reads_the_modules_parameters(vlm: LoadedVLM) -> None:
    attn = vlm.adapter.layers[0].self_attn
    h = torch.randn(1, 3, vlm.adapter.text_config.hidden_size).to(
        vlm.adapter.device, vlm.adapter.dtype)  # (1, 3, hidden)
    with torch.enable_grad():
        assert fused_of(attn) is None
        q, _, _ = vlm.adapter.qkv(attn, h)
        q.sum().backward()
    grad = attn.q_proj.weight.grad
    vlm.model.zero_grad(set_to_none=True)
    assert grad is not None and grad.abs().sum() > 0
