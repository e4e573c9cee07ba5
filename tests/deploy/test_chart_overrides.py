"""The chart rendered with overrides (external Redis, replicas, GPUs, API keys, claims), and the
values it refuses."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import pytest

from service.cli import _parser
from tests.deploy.chart import (
    container,
    container_env,
    env_entries,
    full,
    pod_spec,
    render,
    settings_of,
    validate,
)

EXTERNAL = "rediss://:s3cret@redis.example.internal:6380/2"


def _env(values: dict[str, Any], name: str) -> dict[str, str]:
    out = render(values)
    return container_env(out, container(out.one("Deployment", full(name))))


def test_external_redis_url_replaces_the_bundled_redis() -> None:
    out = render({"redis": {"enabled": False}, "externalRedis": {"url": EXTERNAL}})
    validate(out)
    assert not out.all("StatefulSet") and not out.all("NetworkPolicy")
    assert [s["metadata"]["name"] for s in out.all("Service")] == \
        [full("api"), full("worker-metrics")]
    secret = out.secret_data(full())
    assert secret["CONDUIT_REDIS_URL"] == EXTERNAL and "REDIS_PASSWORD" not in secret
    for name in ("api", "worker"):
        env = container_env(out, container(out.one("Deployment", full(name))))
        assert settings_of(env).storage.redis_url == EXTERNAL


def test_external_redis_from_an_existing_secret_is_referenced() -> None:
    out = render({"redis": {"enabled": False},
                  "externalRedis": {"existingSecret": "ops-redis", "existingSecretKey": "url"}})
    validate(out)
    assert "CONDUIT_REDIS_URL" not in out.secret_data(full())
    for name in ("api", "worker"):
        entry = env_entries(container(out.one("Deployment", full(name))))["CONDUIT_REDIS_URL"]
        assert entry["valueFrom"]["secretKeyRef"] == {"name": "ops-redis", "key": "url"}


def test_worker_replicas_gpus_and_concurrency() -> None:
    out = render({"worker": {"replicas": 4, "gpu": 2, "concurrency": 3},
                  "api": {"replicas": 2, "gpu": 1}})
    validate(out)
    worker = out.one("Deployment", full("worker"))
    assert worker["spec"]["replicas"] == 4
    assert container(worker)["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container(worker)["resources"]["limits"]["memory"] == "32Gi"  # merged, not replaced
    args = _parser().parse_args(container(worker)["command"][1:])
    assert args.func.__name__ == "_worker" and args.concurrency == 3
    api = out.one("Deployment", full("api"))
    assert api["spec"]["replicas"] == 2
    assert container(api)["resources"]["limits"]["nvidia.com/gpu"] == 1
    for name in ("api", "worker"):
        assert settings_of(container_env(out, container(out.one("Deployment", full(name))))) \
            .core.device == "cuda"


def test_a_cpu_worker_requests_no_gpu() -> None:
    out = render({"worker": {"gpu": 0, "tolerations": []}})
    validate(out)
    worker = out.one("Deployment", full("worker"))
    assert "nvidia.com/gpu" not in container(worker)["resources"]["limits"]
    assert "tolerations" not in pod_spec(worker)
    assert settings_of(container_env(out, container(worker))).core.device == "cpu"


def test_api_keys_land_in_the_secret_only() -> None:
    keys = ["key-alpha-0123456789", "key-beta-9876543210"]
    out = render({"auth": {"apiKeys": keys}})
    validate(out)
    assert json.loads(out.secret_data(full())["CONDUIT_API_KEYS"]) == keys
    others = [d for d in out.docs if d["kind"] != "Secret"]
    assert not any(k in json.dumps(others) for k in keys)
    assert "GENERATED_API_KEY" not in out.notes
    assert "GENERATED_API_KEY" not in out.secret_data(full())
    env = container_env(out, container(out.one("Deployment", full("api"))))
    assert [k.get_secret_value() for k in settings_of(env).service.api_keys] == keys


def test_api_keys_from_an_existing_secret() -> None:
    out = render({"auth": {"existingSecret": "team-keys", "existingSecretKey": "keys"}})
    validate(out)
    assert "CONDUIT_API_KEYS" not in out.secret_data(full())
    entry = env_entries(container(out.one("Deployment", full("api"))))["CONDUIT_API_KEYS"]
    assert entry["valueFrom"]["secretKeyRef"] == {"name": "team-keys", "key": "keys"}


def test_a_given_redis_password_is_used_and_auth_can_be_off() -> None:
    out = render({"redis": {"auth": {"password": "pw-Given.1"}}})
    assert out.secret_data(full())["CONDUIT_REDIS_URL"] == \
        f"redis://:pw-Given.1@{full('redis')}:6379/0"
    off = render({"redis": {"auth": {"enabled": False}}})
    validate(off)
    assert off.secret_data(full())["CONDUIT_REDIS_URL"] == f"redis://{full('redis')}:6379/0"
    assert "--requirepass" not in container(off.one("StatefulSet", full("redis")))["args"]


def test_an_existing_claim_is_mounted_by_api_and_worker() -> None:
    out = render({"persistence": {"existingClaim": "shared-nfs", "mountPath": "/srv/conduit"}})
    validate(out)
    assert not out.all("PersistentVolumeClaim")
    for name in ("api", "worker"):
        workload = out.one("Deployment", full(name))
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        assert volumes["home"]["persistentVolumeClaim"]["claimName"] == "shared-nfs"
        env = container_env(out, container(workload))
        assert str(settings_of(env).storage.home) == "/srv/conduit"
        assert env["HF_HOME"] == "/srv/conduit/huggingface"
        assert {"name": "home", "mountPath": "/srv/conduit"} in container(workload)["volumeMounts"]


def test_a_real_model_configuration_reaches_settings_exactly() -> None:
    env = _env({"config": {"model": "Qwen/Qwen2.5-VL-7B-Instruct", "dtype": "bfloat16",
                           "disk_kv_bytes": 200 * 2**30, "budget": 0.15, "ingest_timeout_s": 900,
                           "kv_int8": True, "head_agg": "max"},
                "worker": {"terminationGracePeriodSeconds": 960}}, "worker")
    s = settings_of(env)
    assert (s.core.model, s.core.dtype, s.core.budget, s.storage.kv_int8, s.core.head_agg) == \
        ("Qwen/Qwen2.5-VL-7B-Instruct", "bfloat16", 0.15, True, "max")
    assert s.storage.disk_kv_bytes == 200 * 2**30
    assert env["CONDUIT_DISK_KV_BYTES"] == str(200 * 2**30)
    assert s.worker.ingest_timeout_s == 900.0


@pytest.mark.parametrize(("values", "message"), [
    ({"redis": {"maxmemoryPolicy": "allkeys-lru"}}, "could evict metadata"),
    ({"config": {"redis_kv_ttl_s": None}}, "set config.redis_kv_ttl_s"),
    ({"externalRedis": {"url": EXTERNAL}}, "not both"),
    ({"redis": {"enabled": False}}, "needs Redis"),
    ({"redis": {"auth": {"password": "p@ss"}}}, "letters, digits"),
    ({"worker": {"device": "cpu"}}, "wastes the GPU"),
    ({"auth": {"generate": False}}, "needs keys"),
    ({"redis": {"enabled": False}, "externalRedis": {"url": EXTERNAL},
      "worker": {"autoscaling": {"keda": {"enabled": True}}}}, "keda.address"),
    ({"ingress": {"enabled": True}}, "ingress.hosts"),
    ({"gateway": {"enabled": True}}, "parentRefs"),
])
def test_unsafe_combinations_are_refused_with_a_reason(values: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(values)


@pytest.mark.parametrize(("values", "message"), [
    ({"config": {"modle": "x"}}, "additional properties 'modle'"),
    ({"config": {"budget": 1.5}}, "maximum"),
    ({"config": {"dtype": "int4"}}, "config/dtype"),
    ({"config": {"score_layers": "first"}}, "config/score_layers"),
    ({"worker": {"gpu": -1}}, "worker/gpu"),
    ({"externalRedis": {"url": "http://redis"}}, "externalRedis/url"),
    ({"metrics": {"workerPort": 70000}}, "metrics/workerPort"),
    ({"ingress": {"hosts": ["Bad_Host"]}}, "ingress/hosts"),
    ({"worker": {"autoscaling": {"keda": {"minReplicas": -1}}}}, "minReplicas"),
])
def test_the_values_schema_rejects_bad_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=message):
        render(values)
