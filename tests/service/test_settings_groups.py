"""The settings come in four groups, one per layer, and every `CONDUIT_*` name a deployment
set before the split still sets the same field, now read from its group."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.settings import GROUPS, Settings

# Every environment name of the flat Settings before it was split into groups (fields added
# since then are free to join; none of these may go or change its name).
FLAT_NAMES_BEFORE_THE_GROUPS = """
model device torch_threads dtype max_page_tokens home redis_url memory_kv_bytes disk_kv_bytes
redis_kv_ttl_s kv_int8 max_upload_bytes max_pages quota_bytes quota_documents quota_pages
disk_reserve_bytes render_dpi max_page_pixels ingest_timeout_s ocr ocr_workers page_memory_mb
page_timeout_s reader_memory_mb max_queued_documents_per_tenant prefill_on_ingest policy budget
head_cache label_cache label_refresh label_cache_entries never_above_full gamma score_layers
query_window head_agg bm25_weight dense_weight retrieval_index index_depth index_ivf_min_rows
index_scan_rows index_lock_timeout_s rrf_k ref_weight clean_queries top_k max_new_tokens
max_active_answers max_answers_per_tenant max_kv_tokens_in_flight decode_compile
worker_metrics_port max_question_tokens job_lease_s max_ingest_attempts reaper_interval_s
answer_queue_wait_s answer_timeout_s api_keys api_keys_file metrics_key allow_open_network
allowed_hosts http_header_timeout_s http_body_timeout_s http_body_min_rate
http_max_header_bytes http_keep_alive_s http_max_connections
""".split()


def _group_of() -> dict[str, str]:
    """Flat field name -> its group; fails if two groups share a name (one env name would
    then set two fields)."""
    out: dict[str, str] = {}
    for group, model in GROUPS.items():
        for name in model.model_fields:
            assert name not in out, f"{name} is in both {out[name]} and {group}"
            out[name] = group
    return out


def test_every_old_name_is_a_field_of_one_group() -> None:
    group_of = _group_of()
    missing = sorted(set(FLAT_NAMES_BEFORE_THE_GROUPS) - set(group_of))
    assert not missing, f"CONDUIT_{missing[0].upper()} no longer sets anything"
    http = {n for n in group_of if n.startswith("http_")} | {"api_keys", "allowed_hosts"}
    assert {group_of[n] for n in http} == {"service"}  # HTTP belongs to the service


def test_the_flat_environment_names_fill_the_groups(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    env = {
        "CONDUIT_API_KEYS": '["key-one", "key-two"]',
        "CONDUIT_ALLOWED_HOSTS": '["conduit.example"]',
        "CONDUIT_HTTP_KEEP_ALIVE_S": "7.5",
        "CONDUIT_MODEL": "builtin:tiny-qwen2-vl",
        "CONDUIT_POLICY": "full_reuse",
        "CONDUIT_BUDGET": "0.25",
        "CONDUIT_REDIS_URL": "redis://redis.example:6379/0",
        "CONDUIT_QUOTA_BYTES": "12345",
        "CONDUIT_HOME": str(tmp_path),
        "CONDUIT_TOP_K": "5",
        "CONDUIT_MAX_ACTIVE_ANSWERS": "4",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    s = Settings()
    assert [k.get_secret_value() for k in s.service.api_keys] == ["key-one", "key-two"]
    assert s.service.allowed_hosts == ["conduit.example"]
    assert s.service.http_keep_alive_s == 7.5
    assert (s.core.model, s.core.policy, s.core.budget) == ("builtin:tiny-qwen2-vl",
                                                           "full_reuse", 0.25)
    assert s.storage.redis_url == "redis://redis.example:6379/0" and not s.embedded
    assert (s.storage.quota_bytes, s.storage.home) == (12345, tmp_path)
    assert (s.worker.top_k, s.worker.max_active_answers) == (5, 4)
    # a name the constructor is given wins over the environment's; the rest stay
    s = Settings(budget=0.5, home=tmp_path / "other")
    assert (s.core.budget, s.core.policy) == (0.5, "full_reuse")
    assert (s.storage.home, s.storage.quota_bytes) == (tmp_path / "other", 12345)


def test_a_bad_value_under_a_flat_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUIT_BUDGET", "1.5")  # a share: at most 1
    with pytest.raises(ValidationError, match="budget"):
        Settings()
