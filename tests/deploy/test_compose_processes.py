"""docker-compose.yml's own processes, run for real: the distributed form's services (api,
worker, redis) as `docker compose --env-file deploy/distributed.env up` would configure them:
each service's command and environment as interpolated from the env file and the shell
variables a user sets (API keys, metrics key, model), over the image's ENV. Only what must
differ here is rewritten: the named volume's mount path to a temp folder, the `redis` service
address to a local redis-server started with the compose redis command's arguments, the api's
port to a free one. Then a client uploads and asks, the image's HEALTHCHECK URL answers, and
the metrics key reads /metrics. A setting compose sets that Settings does not know fails."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from lab.processes import free_port, start_redis
from tests.deploy import processes as pr
from tests.deploy.compose import DISTRIBUTED_ENV, compose, dockerfile, env_file, image_env

API_KEY, METRICS_KEY = "compose-tenant-key-0123456789", "compose-metrics-key-0123456789"
SHELL = {"CONDUIT_API_KEYS": f'["{API_KEY}"]', "CONDUIT_METRICS_KEY": METRICS_KEY,
         "CONDUIT_MODEL": "builtin:tiny-qwen2-vl"}  # the tiny builtin: fast on CPU


@dataclass
class Up:
    services: dict[str, Any]
    procs: dict[str, pr.Proc]
    api_url: str
    answer: dict[str, object]


def _mounts(service: dict[str, Any], tmp: Path) -> dict[str, Path]:
    """Mount path -> local folder of each named volume (shared by the services mounting it)."""
    out = {}
    for spec in service["volumes"]:
        volume, path = spec.split(":")[:2]
        out[path] = tmp / "volumes" / volume
        out[path].mkdir(parents=True, exist_ok=True)
    return out


def _local(services: dict[str, Any], name: str, tmp: Path, redis_url: str) -> pr.Proc:
    service = services[name]
    env = {k: str(v) for k, v in (image_env() | service["environment"]).items()}
    env = pr.rewrite_paths(env, _mounts(service, tmp))
    env["CONDUIT_REDIS_URL"] = pr.rewrite_redis_url(env["CONDUIT_REDIS_URL"], redis_url,
                                                    "redis", 6379)
    argv = pr.local_argv(service["command"])
    ports = {}
    for spec in service.get("ports", []):
        container_port = int(spec.rsplit(":", 1)[1])
        ports[str(container_port)] = free_port()
        argv = pr.rewrite_port_arg(argv, container_port, ports[str(container_port)])
    return pr.Proc(name, argv, env, ports)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("compose")
    logs = tmp / "logs"
    logs.mkdir()
    services = compose(env_file(DISTRIBUTED_ENV) | SHELL)["services"]
    redis_args = services["redis"]["command"]
    assert redis_args[0] == "redis-server" and "--port" not in redis_args  # 6379
    redis_url, stop_redis = start_redis(tmp, args=redis_args[1:])
    procs = {n: _local(services, n, tmp, redis_url) for n in ("api", "worker")}
    running = pr.start(list(procs.values()), logs)
    try:
        api_url = f"http://127.0.0.1:{next(iter(procs['api'].ports.values()))}"
        pr.wait_http(api_url + "/readyz", running, logs)
        api = pr.client(api_url, API_KEY)
        answer = pr.ingest_then_ask(api, *pr.upload(api), logs)
        yield Up(services, procs, api_url, answer)
    finally:
        pr.stop(running)
        stop_redis()


def test_compose_services_ingest_and_answer(up: Up) -> None:
    citations: list[dict[str, Any]] = up.answer["citations"]  # type: ignore[assignment]
    assert citations[0]["page"] == 1
    info = httpx.get(up.api_url + "/v1/info", headers={"Authorization": f"Bearer {API_KEY}"})
    assert info.json()["embedded"] is False and info.json()["model_loaded"] is False


def test_the_image_healthcheck_answers(up: Up) -> None:
    (check,) = [rest for op, rest in dockerfile() if op == "HEALTHCHECK"]
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/\S*?)'", check)
    assert url is not None, check
    local = up.procs["api"].ports[url[1]]  # the port compose publishes is the one it checks
    assert httpx.get(f"http://127.0.0.1:{local}{url[2]}", timeout=10).status_code == 200


def test_metrics_take_the_metrics_key(up: Up) -> None:
    url = up.api_url + "/metrics"
    assert httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 403
    r = httpx.get(url, headers={"Authorization": f"Bearer {METRICS_KEY}"})
    assert r.status_code == 200 and "conduit_queries_total" in r.text
