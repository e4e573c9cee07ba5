"""A conversation's follow-ups over kept and rebuilt prefixes (`conduit_core.conversation`).

A follow-up whose prefix is kept computes only its own rows, charged by the FLOPs formula,
and its first-token logits are those of one pass over the same layout after the same
refreshed rows; one that brings a page refreshes only that page's rows and the turn's; a
prefix rebuilt from text and pages gives the same tokens as a kept one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conduit_core.answer_types import AnswerRequest, PageInput, Turn
from conduit_core.conversation import ConversationCache, turn_texts
from conduit_core.kv.kv_cache import KVCache
from conduit_core.pass_observer import Phase
from conduit_core.passes.assembly import Assembly
from conduit_core.passes.layer_forward import forward_rows, logits_of
from conduit_core.passes.prompt_head import HeadKV
from conduit_core.policies.selection import budget_tokens
from conduit_core.prompt.conversation import turn_layout
from conduit_core.runtime import ReuseRuntime
from lab import answering
from tests.core.conftest import load_builtin
from tests.core.helpers import IMAGES

TWO_FAMILIES = ["builtin:tiny-qwen2-vl", "builtin:tiny-llava-onevision"]
PREFIX = "Answer from the pages."
Q1, Q2, Q3 = "What does the first page show?", "And the year before?", "What about the last?"


def _setup(name: str, cache: Path,
           never_above_full: bool = True) -> tuple[ReuseRuntime, list[PageInput]]:
    rt = ReuseRuntime(load_builtin(name, cache), never_above_full=never_above_full)
    kvs = rt.prefill_pages([IMAGES["a"], IMAGES["b"], IMAGES["c"]])
    return rt, [PageInput(f"[report.pdf p.{i + 1}]", kv) for i, kv in enumerate(kvs)]


def _ask(pages: list[PageInput], question: str, history: tuple[Turn, ...] = (),
         tenant: str = "t1") -> AnswerRequest:
    return AnswerRequest(PREFIX, pages, question, max_new_tokens=6, keep=True,
                         history=history, namespace=tenant)


@pytest.mark.parametrize("name", TWO_FAMILIES)
def test_a_kept_follow_up_computes_its_own_rows_as_one_pass_would(
        name: str, model_cache: Path) -> None:
    rt, pages = _setup(name, model_cache)
    first = answering.start_answer(rt, _ask(pages[:2], Q1))
    n1 = first.layout.n
    turn1_rows = (first.decode.cache.keys[:, :1, :, :n1].clone(),
                  first.decode.cache.values[:, :1, :, :n1].clone())  # refreshed turn 1
    r1 = answering.finish(rt, first)
    history = (Turn(tuple(pages[:2]), Q1, r1.text),)

    follow = answering.start_answer(rt, _ask([], Q2, history))
    assert follow.conversation == "hit"
    layout = follow.layout
    own = torch.arange(layout.head, layout.n)  # (R,) the rows after the kept prefix
    assert layout.head > n1 and own.numel() < layout.n // 4
    expected = rt.reuse.costs.refresh(layout, own, last_only=True)
    assert follow.flops_used_lm == pytest.approx(expected, rel=1e-12)

    # the same layout in one pass: turn 1's refreshed rows, then every row after them
    adapter = rt.adapter
    cache = KVCache.allocate(adapter, 1, layout.n)
    cache.keys[:, :, :, :n1], cache.values[:, :, :, :n1] = turn1_rows
    rows = torch.arange(n1, layout.n)  # (R',) answer 1 and turn 2
    embeds = adapter.embed_tokens(layout.token_ids[rows].to(adapter.device)).unsqueeze(0)
    with torch.no_grad():
        hidden = forward_rows(adapter, cache, embeds, rows.to(adapter.device),
                              layout.position_ids[:, rows].unsqueeze(1).to(adapter.device),
                              n_keys=layout.n)  # (1, R', hidden)
        one_pass = logits_of(adapter, hidden[:, -1:])[0, -1].float()  # (vocab,)
    got = follow.decode.logits.float()  # (vocab,)
    torch.testing.assert_close(got, one_pass, rtol=1e-5,
                               atol=1e-5 * float(one_pass.abs().max()))
    answering.finish(rt, follow)


def test_follow_ups_assemble_in_the_workspace(model_cache: Path) -> None:
    """A follow-up's cache comes from the runtime's workspace, as a first turn's does: the
    same follow-up asked again writes into the storage the first one gave back."""
    rt, pages = _setup("builtin:tiny-qwen2-vl", model_cache)
    r1 = answering.answer(rt, _ask(pages[:2], Q1))
    follow = _ask([], Q2, (Turn(tuple(pages[:2]), Q1, r1.text),))
    storage = []
    for _ in range(2):
        state = answering.start_answer(rt, follow)
        assert state.conversation == "hit"
        storage.append(state.decode.cache.keys.data_ptr())
        answering.finish(rt, state)  # its cache goes back at its first step into a slot
    assert storage[0] == storage[1]


@pytest.mark.parametrize("pooled", [True, False])
@pytest.mark.parametrize("name", TWO_FAMILIES)
def test_a_kept_prefix_takes_its_answer_rows_from_the_decode(
        name: str, pooled: bool, model_cache: Path) -> None:
    """The answer's rows of a kept prefix are those its decode wrote (in a pool slot or in
    its own cache), equal to the same rows computed in one pass; only the rows the decode
    never computed (the end of the turn, the next opening) are computed and charged."""
    rt = ReuseRuntime(load_builtin(name, model_cache), decode_positions=65536 if pooled else 1)
    kvs = rt.prefill_pages([IMAGES["a"], IMAGES["b"]])
    pages = [PageInput(f"[report.pdf p.{i + 1}]", kv) for i, kv in enumerate(kvs)]
    first = answering.start_answer(rt, _ask(pages, Q1))
    n1 = first.layout.n
    turn1_rows = (first.decode.cache.keys[:, :1, :, :n1].clone(),
                  first.decode.cache.values[:, :1, :, :n1].clone())  # refreshed turn 1
    r1 = answering.finish(rt, first)
    assert (first.decode.slot is None) and (r1.stop_reason, len(r1.token_ids)) == ("length", 6)
    adapter = rt.adapter
    ids = adapter.answer_ids(r1.text) + adapter.page_opening_ids()
    decoded = r1.token_ids[:5]  # the last token was never fed back: no K/V
    taken = next((i for i, (a, b) in enumerate(zip(ids, decoded, strict=False)) if a != b),
                 len(decoded))
    assert taken > 0  # the rows the text tokenizes to as decoded

    follow = answering.start_answer(rt, _ask([], Q2, (Turn(tuple(pages), Q1, r1.text),)))
    assert follow.conversation == "hit"
    head = follow.layout.head
    assert head == n1 + len(ids)
    computed = torch.arange(n1 + taken, head)  # (r,) what the decode did not write
    expected = rt.reuse.costs.rows(computed, head, last_only=True)
    assert r1.kept_flops_lm == pytest.approx(expected, rel=1e-12)

    # the prefix's rows after turn 1 in one pass over turn 1's refreshed rows
    cache = KVCache.allocate(adapter, 1, head)
    cache.keys[:, :, :, :n1], cache.values[:, :, :, :n1] = turn1_rows
    rows = torch.arange(n1, head)  # (m,)
    layout = follow.layout
    embeds = adapter.embed_tokens(layout.token_ids[rows].to(adapter.device)).unsqueeze(0)
    with torch.no_grad():
        forward_rows(adapter, cache, embeds, rows.to(adapter.device),
                     layout.position_ids[:, rows].unsqueeze(1).to(adapter.device),
                     n_keys=head)
    for got, want in ((follow.decode.cache.keys, cache.keys),
                      (follow.decode.cache.values, cache.values)):
        got, want = got[:, :1, :, n1:head].float(), want[:, :, :, n1:head].float()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    answering.finish(rt, follow)


def test_a_turn_kept_in_a_batch_keeps_its_own_rows(model_cache: Path) -> None:
    """A kept turn that ends while another answer decodes beside it keeps its own rows: its
    decode slot, given back at the next step, takes the other answer's cache; a follow-up
    over it answers as over its prefix rebuilt."""
    rt, pages = _setup("builtin:tiny-qwen2-vl", model_cache)
    short = answering.start_answer(rt, replace(_ask(pages[:1], Q1), max_new_tokens=2))
    long = answering.start_answer(rt, _ask(pages[1:2], Q3))
    while not short.done:
        rt.step([short, long])
    assert long.decode.slot == 0  # moved into the short one's slot as that one ended
    while not long.done:
        rt.step([short, long])
    first = rt.result(short)
    rt.result(long)
    follow = _ask([], Q2, (Turn((pages[0],), Q1, first.text),))
    hit = answering.start_answer(rt, follow)
    hit_logits = hit.decode.logits.clone()  # (vocab,)
    answering.finish(rt, hit)
    rt.conversations.clear()
    rebuilt = answering.start_answer(rt, follow)
    assert (hit.conversation, rebuilt.conversation) == ("hit", "rebuilt")
    torch.testing.assert_close(rebuilt.decode.logits, hit_logits, rtol=1e-5,
                               atol=1e-5 * float(hit_logits.abs().max()))
    answering.finish(rt, rebuilt)


class _Writes:
    """Rows whose K/V the scoring and refresh phases changed."""

    def __init__(self) -> None:
        self.rows = torch.zeros(0, dtype=torch.long)

    @contextmanager
    def _watch(self, assembly: Assembly) -> Iterator[None]:
        n = assembly.layout.n
        before = assembly.cache.keys[:, 0, :, :n].clone()  # (L, kv, N, hd)
        yield
        after = assembly.cache.keys[:, 0, :, :n]
        changed = (before != after).flatten(0, 1).any(dim=0).any(dim=-1)  # (N,)
        rows = torch.cat([self.rows, torch.nonzero(changed.cpu()).view(-1)])
        self.rows = rows.unique(sorted=True)

    def phase(self, name: Phase, assembly: Assembly) -> AbstractContextManager[object]:
        return self._watch(assembly) if name in ("scoring", "refresh") else nullcontext()


def test_a_new_page_refreshes_only_its_rows_and_the_turns(model_cache: Path) -> None:
    # tiny pages: the fallback would refresh the whole page; the policy's own rows here
    rt, pages = _setup("builtin:tiny-qwen2-vl", model_cache, never_above_full=False)
    r1 = answering.answer(rt, _ask(pages[:2], Q1))
    history = (Turn(tuple(pages[:2]), Q1, r1.text),)
    writes = _Writes()
    rt.reuse.observer = writes
    state = answering.start_answer(rt, _ask(pages[2:], Q3, history))
    rt.reuse.observer = None
    assert state.conversation == "hit"
    layout = state.layout
    (segment,) = layout.segments  # the page this turn adds
    n_new = segment.length
    assert state.refreshed == budget_tokens(0.1, n_new) > 0
    assert writes.rows.numel() and int(writes.rows.min()) >= layout.head
    new_page = torch.arange(segment.start, segment.stop)
    visual_written = writes.rows[torch.isin(writes.rows, new_page)]
    assert 0 < visual_written.numel() <= state.refreshed
    answering.finish(rt, state)


@pytest.mark.parametrize("name", TWO_FAMILIES)
def test_a_rebuilt_prefix_gives_the_tokens_of_a_kept_one(name: str, model_cache: Path) -> None:
    rt, pages = _setup(name, model_cache)
    r1 = answering.answer(rt, _ask(pages[:2], Q1))
    h1 = (Turn(tuple(pages[:2]), Q1, r1.text),)
    r2 = answering.answer(rt, _ask([], Q2, h1))
    h2 = (*h1, Turn((), Q2, r2.text))
    third = _ask(pages[2:], Q3, h2)
    hit_state = answering.start_answer(rt, third)
    hit_logits = hit_state.decode.logits.clone()  # (vocab,)
    hit = answering.finish(rt, hit_state)
    rt.conversations.clear()  # a restart, an eviction, another worker
    rebuilt_state = answering.start_answer(rt, third)
    # the kept answer rows are the decode's, the rebuilt ones one pass's: float rounding
    torch.testing.assert_close(rebuilt_state.decode.logits, hit_logits, rtol=1e-5,
                               atol=1e-5 * float(hit_logits.abs().max()))
    rebuilt = answering.finish(rt, rebuilt_state)
    assert (r2.conversation, hit.conversation, rebuilt.conversation) == ("hit", "hit",
                                                                          "rebuilt")
    assert rebuilt.token_ids == hit.token_ids
    assert rebuilt.fill_flops_lm > 0 == hit.fill_flops_lm
    # the rebuild kept every turn it rebuilt: the next ask is a hit again
    assert answering.answer(rt, third).conversation == "hit"


def test_a_prefix_is_kept_per_tenant(model_cache: Path) -> None:
    rt, pages = _setup("builtin:tiny-qwen2-vl", model_cache)
    r1 = answering.answer(rt, _ask(pages[:1], Q1, tenant="a"))
    history = (Turn(tuple(pages[:1]), Q1, r1.text),)
    other = answering.answer(rt, _ask([], Q2, history, tenant="b"))
    own = answering.answer(rt, _ask([], Q2, history, tenant="a"))
    assert (other.conversation, own.conversation) == ("rebuilt", "hit")
    assert other.token_ids == own.token_ids


def test_the_layout_only_grows(model_cache: Path) -> None:
    rt, pages = _setup("builtin:tiny-qwen2-vl", model_cache)
    one = turn_layout(rt.adapter, PREFIX, turn_texts((), pages[:2], Q1))
    history = (Turn(tuple(pages[:2]), Q1, "It shows a table."),)
    two = turn_layout(rt.adapter, PREFIX, turn_texts(history, pages[2:], Q3))
    assert torch.equal(two.token_ids[:one.n], one.token_ids)
    assert torch.equal(two.position_ids[:, :one.n], one.position_ids)
    assert two.segments[0].start > two.head > one.n


def test_a_prefix_is_kept_per_page_not_per_label(model_cache: Path) -> None:
    rt, pages = _setup("builtin:tiny-qwen2-vl", model_cache)
    r1 = answering.answer(rt, _ask(pages[:1], Q1))
    # the same label and question over another page of the same size: not the same prefix
    other = PageInput(pages[0].label, rt.prefill_pages([IMAGES["a"].rotate(180)])[0])
    assert torch.equal(other.kv.token_ids, pages[0].kv.token_ids)
    swapped = (Turn((other,), Q1, r1.text),)
    assert answering.answer(rt, _ask([], Q2, swapped)).conversation == "rebuilt"
    same = (Turn(tuple(pages[:1]), Q1, r1.text),)
    assert answering.answer(rt, _ask([], Q2, same)).conversation == "hit"


def test_the_engine_reserves_a_follow_ups_whole_conversation(model_cache: Path) -> None:
    """The engine's bound of an answer's cache positions (`kv_tokens_needed`) holds a
    follow-up, whose layout is the whole conversation, not only the pages it adds."""
    from worker.scheduler import kv_tokens_needed

    rt, pages = _setup("builtin:tiny-qwen2-vl", model_cache)
    r1 = answering.answer(rt, _ask(pages, Q1))
    follow = _ask([], Q2, (Turn(tuple(pages), Q1, r1.text),))
    state = answering.start_answer(rt, follow)
    assert state.kv_tokens <= kv_tokens_needed(follow)
    answering.finish(rt, state)


def test_kept_prefixes_are_bounded_per_tenant_and_in_bytes() -> None:
    def prefix(rows: int) -> HeadKV:
        kv = torch.zeros(2, 1, rows, 4)  # (L, kv, rows, hd): 32 bytes a row of keys
        return HeadKV(tuple(range(rows)), kv, kv.clone(), torch.zeros(0, 4))

    cache = ConversationCache(per_namespace=2, max_bytes=64 * 10)  # 10 rows of K and V
    for key in ("a1", "a2", "a3"):
        cache.put("a", key, prefix(2))
    assert [cache.get("a", k) is not None for k in ("a1", "a2", "a3")] == [False, True, True]
    cache.put("b", "b1", prefix(4))  # 8 rows in all now
    cache.get("a", "a2")  # touched: a3 is now the oldest
    cache.put("b", "b2", prefix(2))  # 10 rows: fits
    cache.put("c", "c1", prefix(1))  # 11 rows: the oldest of all goes
    assert cache.get("a", "a3") is None and cache.get("a", "a2") is not None
    assert cache.nbytes <= cache.max_bytes and len(cache) == 4
    cache.put("d", "d1", prefix(11))  # larger than the bound alone: not kept, nothing left
    assert len(cache) == 0 and cache.nbytes == 0
