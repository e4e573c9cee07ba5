"""The settings of `conduit_core`: which model loads where, and how the reuse runtime refreshes
and decodes. Entry points pass these values to the core as plain arguments."""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from conduit_core.policies.choice import DEFAULT_POLICY
from worker.settings.fields import FLAT_ENV


class CoreSettings(BaseSettings):
    """The model and the reuse runtime."""

    model_config = FLAT_ENV

    # the model
    model: str = Field(
        "builtin:small-qwen2-vl",
        description="Local path or hub id of a supported VLM, or a builtin model: "
        "builtin:small-qwen2-vl (the default: random weights, pages of up to 512 visual "
        "tokens, sized so that reuse pays off on a CPU), builtin:tiny-* (test sizes), "
        "builtin:testbed-qwen2-vl (the trained testbed).",
    )
    device: str = Field("cpu", description="torch device, e.g. cpu or cuda:0.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto = float32 on CPU, bfloat16 on CUDA."
    )
    max_page_tokens: int | None = Field(
        None, ge=4, le=16384,
        description="Cap on visual tokens per page (bounds KV size); unset = the model's "
        "default (256 for real checkpoints, 512 for builtin:small-qwen2-vl, 16 for the "
        "builtin tiny models, 256 for the testbed).",
    )

    # the reuse runtime: refresh policy, caches, decode
    policy: str = Field(DEFAULT_POLICY, description="Refresh policy of a question that names "
                        "none (one of `GET /v1/info`'s policies).")
    budget: float = Field(0.10, ge=0.0, le=1.0, description="Fraction of visual tokens refreshed.")
    head_cache: bool = Field(
        True, description="Compute the prompt head (chat template opening and answer "
        "instructions, identical for every question) once per model and reuse it exactly.")
    label_cache: bool = Field(
        True, description="Compute each page label once after the prompt head and reuse it "
        "stale like its page (recomputed with its whole page); off = labels are text rows, "
        "computed in both passes. Off whenever head_cache is off.")
    label_refresh: Literal["page", "always", "budget", "read"] = Field(
        "read", description="With the label cache, the labels a refresh recomputes: 'read' "
        "(the default) after a scoring pass only the two stale ones the question's scores "
        "read most (chosen on the device), without one as 'always'; 'always' every stale one "
        "(the scoring pass reads them stale; the first, right after the head, is exact as "
        "cached); 'page' only those of the pages it refreshes whole (fewer rows computed; a "
        "model that reads the labels answers worse: measured, lab/testbed/NOTES.md); "
        "'budget' the same labels as 'always' with their rows counted against the refresh "
        "budget (fewer visual tokens refreshed, the same share of rows).")
    label_cache_entries: int = Field(
        1024, ge=1, le=1_000_000, description="Page labels the label cache keeps per model "
        "process (least recently used dropped first). A label's K/V take layers x 2 x "
        "kv_heads x head_dim x dtype bytes a token: about 0.75 MB for a 13-token label on a "
        "7B model in bfloat16, so the default holds about 0.75 GB there.")
    never_above_full: bool = Field(
        True, description="Predict each answer's prefill FLOPs before it runs; where the "
        "policy would cost more than a full prefill from the cached page embeddings, run that "
        "instead (the answer says so: `fallback`). Off = always the policy's own path.")
    gamma: float | None = Field(
        None, ge=0.0, description="CONDUIT amplification exponent; unset = 1 (0 = off)."
    )
    score_layers: str | None = Field(
        None, pattern=r"^(all|-?\d+:-?\d+|0?\.\d*[1-9]\d*|1(\.0*)?)$",
        description="Layers CONDUIT scores with: 'all', 'start:stop', or a depth f in (0, 1] "
        "(the first ceil(f * layers), where the scoring pass stops); unset = the policy's "
        "own: 'all' for conduit, 0.8 for conduit_per_page.",
    )
    query_window: int | None = Field(
        None, ge=1, description="Score with the last w question tokens; unset = all of them "
        "(at most max_question_tokens).",
    )
    head_agg: Literal["mean", "max"] | None = Field(
        None, description="Aggregation over query heads; unset = mean."
    )
    conversation_prefixes: int = Field(
        8, ge=1, le=4096, description="Conversation prefixes (a turn's refreshed KV with its "
        "answer, kept for its follow-up) one model process keeps per tenant, least recently "
        "used dropped first; a follow-up whose prefix is gone rebuilds it from the turns' "
        "text and pages (`cache.conversation`: \"rebuilt\"). A prefix takes the KV of its "
        "tokens: 8 KB a token for the builtin default.")
    conversation_prefix_bytes: int = Field(
        2**30, ge=1, description="Bytes of K/V the kept conversation prefixes of one model "
        "process may take in all tenants together (least recently used dropped first).")
    kv_workspace_bytes: int = Field(
        2**30, ge=0, description="Bytes of idle KV caches one model process keeps for the "
        "next questions: a question's assembled cache (its capacity rounded up to a power of "
        "two) goes back to this workspace once its answer decodes from a decode slot, ends or "
        "fails, and the next question of that capacity reuses it instead of allocating one "
        "(longest idle dropped first). About 17 MB a 3-page question for the builtin default "
        "in float32, 235 MB an 8-page one for a 7B model in bfloat16. 0 = a fresh cache per "
        "question.")
    decode_compile: Literal["auto", "off", "on"] = Field(
        "auto", description="How one decode step of the pooled answers runs: auto = one CUDA "
        "graph per bucket of batch size (1, 2, 4, ... max_active_answers) and span (the "
        "longest answer's keys, up to a slot's capacity and its halves) on a GPU, eager on "
        "the CPU; on = the same on a GPU, torch.compile (inductor) on the CPU; off = eager "
        "everywhere. Other than eager, the decode pool is allocated once when the model "
        "loads and kept: three quarters of max_kv_tokens_in_flight positions as "
        "max_active_answers short slots, the rest as max_active_answers / 8 (at least one) "
        "longer ones (below 4 answers, one tier of equal slots), each tier with its own "
        "buckets. An answer that outgrows its short slot "
        "moves into a free longer one (one copy of its keys) and stays captured; one that no "
        "free slot holds decodes eagerly from its own cache beside the others' captured "
        "steps. The steps give the same tokens up to float rounding.",
    )
    prefill_layer_group: int = Field(
        1, ge=0, le=1024, description="Decoder layers in one phase of a new question's "
        "scoring pass and refresh. The answer engine runs a newcomer's phases for about one "
        "decode step's time between the streaming answers' decode steps, so smaller phases "
        "keep their tokens flowing more evenly (on the CPU one refresh layer of the default "
        "builtin takes about one decode step). 0 = each pass whole. The answers are the same "
        "either way.",
    )

    compile_passes: Literal["auto", "off", "on"] = Field(
        "auto", description="How the layers of the scoring pass and the refresh run: auto = "
        "compiled (torch.compile, fullgraph, CUDA graphs) once per shape bucket of rows and "
        "keys (powers of two) on a GPU, eager on the CPU, where eager is faster "
        "(docs/DECISIONS.md); on = compiled on the CPU too (inductor); off = eager "
        "everywhere. Compiled, the buckets a default question over 1..compile_warmup_pages "
        "pages meets compile when the model loads (logged); others the first time a pass "
        "needs them. Logits equal the eager path's up to float rounding.",
    )
    compile_warmup_pages: int = Field(
        8, ge=0, le=64, description="Where the passes are compiled (compile_passes): the "
        "model's load runs a default question (the default policy, budget and answer length; "
        "questions of 6 to 60 words) over 1 to this many pages, so that their shape buckets "
        "compile before the first user's question (conduit_core/pass_warmup.py). 0 = none.",
    )
    compile_warmup_s: float = Field(
        300.0, ge=0.0, le=3600.0, description="Seconds the pass warm-up may spend: no page "
        "count starts after them (one started is finished); the buckets left compile when a "
        "question first needs them.",
    )

    @cached_property
    def torch_dtype(self) -> str:
        """The dtype name the model runs in."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.device.startswith("cuda") else "float32"
