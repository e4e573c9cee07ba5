"""Exactness 6: a PageKV from another model, dtype or template is refused with a clear error."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.errors import FingerprintMismatch
from conduit_core.policies import choose_policy
from lab import answering
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES


def test_page_from_another_model_is_refused(model_cache: Path) -> None:
    qwen2 = ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache))
    qwen25 = ReuseRuntime(load_builtin("builtin:tiny-qwen2.5-vl", model_cache))
    (foreign,) = qwen25.prefill_pages([IMAGES["a"]])
    request = AnswerRequest("", [PageInput("", foreign)], "What?",
                            policy=choose_policy("full_reuse"),
                            max_new_tokens=2)
    with pytest.raises(FingerprintMismatch, match="tiny-qwen2.5-vl"):
        answering.answer(qwen2, request)


def test_page_of_another_dtype_is_refused(model_cache: Path) -> None:
    f32 = ReuseRuntime(load_builtin("builtin:tiny-internvl", model_cache, dtype="float32"))
    bf16 = ReuseRuntime(load_builtin("builtin:tiny-internvl", model_cache, dtype="bfloat16"))
    (page,) = bf16.prefill_pages([IMAGES["b"]])
    assert page.keys.dtype.is_floating_point and page.fingerprint.dtype == "bfloat16"
    with pytest.raises(FingerprintMismatch, match="bfloat16"):
        f32.reuse.assemble("", [PageInput("", page)], "What?")


def test_page_of_another_template_or_revision_is_refused(model_cache: Path) -> None:
    rt = ReuseRuntime(load_builtin("builtin:tiny-llava-onevision", model_cache))
    (page,) = rt.prefill_pages([IMAGES["c"]])
    for field, value in [("template_version", "other-template"), ("revision", "sha256:0"),
                         ("config_hash", "0" * 64)]:
        other = dataclasses.replace(page, fingerprint=dataclasses.replace(
            page.fingerprint, **{field: value}))
        with pytest.raises(FingerprintMismatch, match="cannot be reused"):
            rt.reuse.assemble("", [PageInput("", other)], "What?")
    rt.reuse.assemble("", [PageInput("", page)], "What?")  # its own page is accepted
