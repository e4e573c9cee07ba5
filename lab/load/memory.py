"""The load bench's memory figures: RSS of a process group, and the bound each role's RSS is
checked against.

Memory bound (`rss_bound_mb`, per role: `service`, and `workers` in the distributed form):
    bound = 1.25 * baseline + engines * (2 * max_kv_tokens_in_flight * kv_bytes_per_token
                                         + memory_kv_bytes)
`baseline` (`rss_baseline_mb`): the RSS of the role's processes right after startup and
`prepare` (model loaded, one document ingested; idle), 25% of it allocator slack.
`max_kv_tokens_in_flight`: the KV positions one engine may hold (`worker.settings.Settings`,
`CONDUIT_MAX_KV_TOKENS_IN_FLIGHT`, as the service reads it). `kv_bytes_per_token`: 2 (K, V) *
layers * kv_heads * head_dim * element bytes (4 in float32, 2 in bfloat16: the service's
dtype) from the model's config alone; x 2 for a cache plus its working copies. `engines`: the
role's model processes (embedded service 1; distributed API 0, workers 2). `memory_kv_bytes`:
each model process's page-KV memory tier (`CONDUIT_MEMORY_KV_BYTES`), which fills with
uploaded pages over a long run. `rss_within_bound` (per role): the level's peak RSS of those
processes (`peak_process_rss_mb`) stayed at or under the bound. `peak_rss_mb` adds their
children, the short-lived PDF reader processes (`worker.ingest.sandbox`: one per upload check
and per ingest's page reader, about 140 MB each, under their own cap
`CONDUIT_PAGE_MEMORY_MB`).

Public API:
  rss_kb(pid, children=True) -> KiB;  group_rss_kb(pids, children=True) -> KiB
  kv_bytes_per_token(model, dtype, home) -> bytes of one KV position
  rss_bounds(baseline_mb, engines, kv_tokens, kv_bytes, memory_tier_bytes=0) -> MB per role
"""

from __future__ import annotations

from pathlib import Path

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def rss_kb(pid: int, children: bool = True) -> int:
    """Resident set of a process and (`children`) its descendants, in KiB (0 if gone)."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(ln.split()[1] for ln in status.splitlines()
                              if ln.startswith("VmRSS:")))
            for task in Path(f"/proc/{p}/task").iterdir() if children else ():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, StopIteration, ValueError):
            continue
    return total


def group_rss_kb(pids: list[int], children: bool = True) -> int:
    """`rss_kb` summed over `pids`."""
    return sum(rss_kb(p, children) for p in pids)


def kv_bytes_per_token(model: str, dtype: str, home: Path) -> int:
    """KV cache bytes of one position: 2 * layers * kv_heads * head_dim * element bytes, from
    the model's config alone (a builtin's from its folder under `home`/models)."""
    from transformers import AutoConfig

    from conduit_core.model.builtin import is_builtin, materialise_builtin
    from conduit_core.model.flops import LMShape

    source = str(materialise_builtin(model, home / "models")) if is_builtin(model) else model
    shape = LMShape.from_config(AutoConfig.from_pretrained(source).get_text_config())
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * ELEMENT_BYTES[dtype]


def rss_bounds(baseline_mb: dict[str, float], engines: dict[str, int],
               kv_tokens: int, kv_bytes: int, memory_tier_bytes: int = 0) -> dict[str, float]:
    """Each role's RSS bound in MB: 1.25 * its baseline + its model processes * (2 * the KV
    positions in flight * bytes per position + the page-KV memory tier's budget) (the module
    docstring)."""
    kv_mb = (2 * kv_tokens * kv_bytes + memory_tier_bytes) / 2**20
    return {role: round(1.25 * base + engines.get(role, 0) * kv_mb, 1)
            for role, base in baseline_mb.items()}
