"""values.yaml, values.schema.json and Settings agree: every Settings field is reachable from the
chart exactly once, and every config value reaches Settings unchanged."""

from __future__ import annotations

import json
from typing import Any

import yaml

from deploy.helm.sync_config_schema import MANAGED, SCHEMA_PATH, config_schema, render, synced
from tests.deploy.chart import CHART, FIELDS, container, container_env, full, setting, settings_of
from tests.deploy.chart import render as render_chart

# A valid, non-default value for every config key (a new Settings field must be added here).
EVERY_KEY: dict[str, Any] = {
    "model": "Qwen/Qwen2.5-VL-7B-Instruct", "dtype": "float16", "max_page_tokens": 512,
    "memory_kv_bytes": 3 * 2**30, "disk_kv_bytes": 500 * 2**30, "redis_kv_ttl_s": 86400,
    "kv_int8": True, "max_upload_bytes": 128 * 2**20, "max_pages": 900, "render_dpi": 144,
    "max_page_pixels": 4_000_000, "ingest_timeout_s": 1234.5, "ocr": False,
    "office_conversion": False, "office_timeout_s": 45.5,
    "prefill_on_ingest": False, "policy": "cacheblend", "budget": 0.25, "gamma": 2.0,
    "head_cache": False, "label_cache": False, "label_refresh": "page",
    "label_cache_entries": 64,
    "never_above_full": False, "max_active_answers": 4, "torch_threads": 3,
    "max_kv_tokens_in_flight": 200_000, "decode_compile": "off",
    "compile_passes": "on", "compile_warmup_pages": 4, "compile_warmup_s": 90.5,
    "prefill_layer_group": 3, "prefill_share": 0.75,
    "conversation_prefixes": 4, "conversation_prefix_bytes": 2**28,
    "kv_workspace_bytes": 2**27,
    "conversation_max_turns": 6, "conversation_max_tokens": 9000,
    "conversation_recency": 0.75, "conversation_max_stored": 50, "conversation_turn_limit": 40,
    "conversation_ttl_s": 3600.0,
    "score_layers": "4:-2", "query_window": 16, "head_agg": "max", "bm25_weight": 0.8,
    "dense_weight": 1.25, "rrf_k": 30.0, "ref_weight": 1.5,
    "clean_queries": False,
    "retrieval_index": False, "index_depth": 500, "index_lock_timeout_s": 30.0,
    "index_ivf_min_rows": 50_000, "index_scan_rows": 8192, "top_k": 7,
    "ocr_workers": 3,
    "page_memory_mb": 3072, "page_timeout_s": 45.0,
    "max_new_tokens": 512, "max_question_tokens": 2048, "job_lease_s": 90.0,
    "max_ingest_attempts": 5, "reaper_interval_s": 20.0, "answer_queue_wait_s": 30.0,
    "answer_timeout_s": 300.0,
    "quota_bytes": 2**30, "quota_documents": 100, "quota_pages": 5000,
    "quota_collections": 20,
    "disk_reserve_bytes": 5 * 2**30, "reader_memory_mb": 4096,
    "max_queued_documents_per_tenant": 20, "max_answers_per_tenant": 8,
    "http_header_timeout_s": 30.0, "http_body_timeout_s": 120.0, "http_body_min_rate": 4096,
    "http_max_header_bytes": 32768, "http_keep_alive_s": 75.0, "http_max_connections": 4096,
}


def test_the_schema_config_section_is_generated_from_settings() -> None:
    text = SCHEMA_PATH.read_text()
    assert text == render(synced(json.loads(text))), \
        "stale: run python deploy/helm/sync_config_schema.py"


def test_every_settings_field_is_config_or_set_by_the_chart() -> None:
    config_keys = set(config_schema()["properties"])
    assert config_keys.isdisjoint(MANAGED)
    assert config_keys | set(MANAGED) == set(FIELDS)


def test_values_yaml_documents_every_config_key() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["config"]) == set(config_schema()["properties"])


def test_every_config_key_reaches_settings_unchanged() -> None:
    assert set(EVERY_KEY) == set(config_schema()["properties"])
    out = render_chart({"config": EVERY_KEY})
    for name in ("api", "worker"):
        s = settings_of(container_env(out, container(out.one("Deployment", full(name)))))
        for key, value in EVERY_KEY.items():
            assert setting(s, key) == value, (name, key)
