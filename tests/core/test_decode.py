"""Decoding from the assembled cache: greedy == stepwise reference, sampling, stop tokens,
streaming callback, TTFT."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conduit_core import AnswerRequest, PageInput, ReuseRuntime
from conduit_core.decode import Detokenizer, Sampler
from conduit_core.errors import UnknownPolicyError
from conduit_core.policies import choose_policy
from lab import answering
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES


@pytest.fixture(scope="module")
def qwen(model_cache: Path) -> ReuseRuntime:
    return ReuseRuntime(load_builtin("builtin:tiny-qwen2-vl", model_cache))


def _request(rt: ReuseRuntime, **kw: object) -> AnswerRequest:
    pages = rt.prefill_pages([IMAGES["a"]])
    return AnswerRequest("Be brief.", [PageInput("Page 1:\n", pages[0])], "What is it?",
                         policy=choose_policy("full_prefill"), **kw)  # type: ignore[arg-type]


def test_streaming_callback_sees_every_token(qwen: ReuseRuntime) -> None:
    seen: list[tuple[int, str]] = []
    result = answering.answer(qwen,
        _request(qwen, max_new_tokens=7), on_token=lambda t, s: seen.append(
        (t, s)))
    assert [t for t, _ in seen] == result.token_ids
    assert "".join(s for _, s in seen) == result.text
    assert 0 < result.ttft_s <= result.total_s


def test_sampling_is_seeded_and_differs_from_greedy(qwen: ReuseRuntime) -> None:
    greedy = answering.answer(qwen, _request(qwen, max_new_tokens=12))
    a = answering.answer(qwen, _request(qwen, max_new_tokens=12, temperature=5.0, seed=7))
    b = answering.answer(qwen, _request(qwen, max_new_tokens=12, temperature=5.0, seed=7))
    c = answering.answer(qwen, _request(qwen, max_new_tokens=12, temperature=5.0, seed=8))
    assert a.token_ids == b.token_ids  # the seed fixes the draw
    assert a.token_ids != c.token_ids  # another seed, another draw (fixed seeds: no chance)
    assert a.token_ids != greedy.token_ids  # temperature 5 is not greedy
    # the sampler on its own: flat logits, greedy always picks the first id
    flat = torch.zeros(50)
    draws = {seed: [int(s.pick(flat)) for s in [Sampler(1.0, 1.0, seed)] for _ in range(20)]
             for seed in (7, 8)}
    assert draws[7] == [int(s.pick(flat)) for s in [Sampler(1.0, 1.0, 7)] for _ in range(20)]
    assert draws[7] != draws[8] and len(set(draws[7])) > 5
    assert {int(Sampler().pick(flat)) for _ in range(5)} == {0}


def test_stop_token_ends_generation(qwen: ReuseRuntime) -> None:
    free = answering.answer(qwen, _request(qwen, max_new_tokens=6))
    assert free.stop_reason == "length" and len(free.token_ids) == 6
    stop = free.token_ids[2]
    qwen.reuse.stop_ids = [stop]
    try:
        stopped = answering.answer(qwen, _request(qwen, max_new_tokens=6))
    finally:
        qwen.reuse.stop_ids = qwen.adapter.stop_token_ids()
    first = free.token_ids.index(stop)
    assert stopped.token_ids == free.token_ids[:first] and stopped.stop_reason == "stop"


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.tensor([5.0, 4.9, -10.0, -10.0])
    sampler = Sampler(temperature=1.0, top_p=0.5, seed=0)
    picks = {int(sampler.pick(logits)) for _ in range(50)}
    assert picks == {0}
    assert int(Sampler().pick(logits)) == 0


def test_unknown_policy_is_a_clear_error(qwen: ReuseRuntime) -> None:
    request = _request(qwen, max_new_tokens=2)
    with pytest.raises(UnknownPolicyError, match="full_reuse"):
        answering.answer(qwen, AnswerRequest(request.prefix, request.pages, request.question,
                                  policy=choose_policy("no-such-policy")))


def test_request_parameters_are_validated() -> None:
    from conduit_core.errors import InvalidRequestError

    for bad in ({"budget": 1.5}, {"max_new_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}):
        with pytest.raises(InvalidRequestError):
            AnswerRequest("", [], "q", **bad)  # type: ignore[arg-type]


def test_bfloat16_answers_with_the_same_code(model_cache: Path) -> None:
    rt = ReuseRuntime(load_builtin("builtin:tiny-internvl", model_cache, dtype="bfloat16"))
    pages = rt.prefill_pages([IMAGES["a"], IMAGES["b"]])
    assert pages[0].keys.dtype == torch.bfloat16
    inputs = [PageInput("Page 1:\n", pages[0]), PageInput("Page 2:\n", pages[1])]
    full = answering.answer(rt, AnswerRequest("Be brief.", inputs, "What?",
                                              policy=choose_policy("full_prefill"),
                                   max_new_tokens=4))
    fresh = answering.answer_full_prefill(rt, "Be brief.", [("Page 1:\n", IMAGES["a"]),
                                                 ("Page 2:\n", IMAGES["b"])], "What?",
                                   max_new_tokens=4)
    reuse = answering.answer(rt, AnswerRequest("Be brief.", inputs, "What?",
                                               policy=choose_policy("full_reuse"),
                                    max_new_tokens=4))
    assert full.token_ids == fresh.token_ids and len(reuse.token_ids) > 0


def test_detokenizer_emits_whole_characters_only(qwen: ReuseRuntime) -> None:
    """Byte-level tokens that split a multi-byte character: nothing until its last byte, then
    the character; bytes that never form one are dropped; pieces concatenate to the text."""
    tok = qwen.vlm.tokenizer
    text = "Total: 12 \u20ac, caf\u00e9 \U0001f600 ok"
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) > len(text.split())  # the tiny vocabulary splits the characters to bytes
    detok = Detokenizer(tok)
    pieces = [detok.step(i) for i in ids]
    assert "".join(pieces) == text
    assert "" in pieces and not any("\ufffd" in p for p in pieces)
    # a lone continuation byte and a control character are dropped, the rest kept
    stray = tok.convert_tokens_to_ids(["\u0122", "\u0100"])  # bytes 0x80 and 0x00 (byte-level)
    detok = Detokenizer(tok)
    out = [detok.step(i) for i in [*tok("ab", add_special_tokens=False).input_ids, *stray,
                                   *tok("cd", add_special_tokens=False).input_ids]]
    assert "".join(out) == "abcd"
    # a lead byte never completed is given up on after MAX_PENDING tokens
    lead = tok.convert_tokens_to_ids("\u00e2")  # byte 0xe2 opens a 3-byte character
    detok = Detokenizer(tok)
    held = [detok.step(lead)] + [detok.step(lead) for _ in range(Detokenizer.MAX_PENDING)]
    assert all(p == "" for p in held)
    assert detok.step(tok("x", add_special_tokens=False).input_ids[0]) == "x"
