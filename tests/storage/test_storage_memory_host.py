"""The memory tier never holds a device tensor: pages prefilled on an accelerator are copied
to host memory (page-locked where CUDA is available) before they are stored, so the tier's
byte budget is host memory and every page reaches the runtime the same way."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from conduit_core.page_kv import PageKV, pin_host_memory
from storage.keys import PageHash
from storage.kv.memory import MemoryKVStore
from tests.storage.kv_testkit import assert_same_page, make_page

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _on(page: PageKV, device: str) -> PageKV:
    moved = {f.name: getattr(page, f.name).to(device) for f in fields(page)
             if isinstance(getattr(page, f.name), torch.Tensor)}
    return PageKV(**{**{f.name: getattr(page, f.name) for f in fields(page)}, **moved})


def _assert_host(page: PageKV) -> None:
    for t in page.tensors():
        assert t.device.type == "cpu"
        assert t.is_pinned() == pin_host_memory()  # pinned exactly where CUDA is available


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quantize", [False, True])
def test_memory_tier_holds_host_tensors_only(device: str, quantize: bool) -> None:
    page = make_page(3)
    store = MemoryKVStore(1 << 26, quantize=quantize)
    store.put_many({PageHash("a" * 64): _on(page, device)})
    (held,) = store._entries.values()
    _assert_host(held)
    _assert_host(store.get_many([PageHash("a" * 64)])[PageHash("a" * 64)])
    if not quantize:
        assert_same_page(held, page)
    assert store.stats().bytes == held.nbytes


def test_runtime_pages_reach_the_tier_on_the_host(tmp_path_factory: pytest.TempPathFactory
                                                  ) -> None:
    """Pages from `prefill_pages` on the test device (CONDUIT_TEST_DEVICE) are host pages."""
    from conduit_core import ReuseRuntime, load_vlm
    from tests.core.helpers import IMAGES
    from tests.device import TEST_DEVICE, TEST_DTYPE

    vlm = load_vlm("builtin:tiny-qwen2-vl", cache_dir=tmp_path_factory.mktemp("m"),
                   device=TEST_DEVICE, dtype=TEST_DTYPE)
    (kv,) = ReuseRuntime(vlm).prefill_pages([IMAGES["a"]])
    store = MemoryKVStore(1 << 26)
    store.put_many({PageHash("b" * 64): kv})
    (held,) = store._entries.values()
    _assert_host(held)
