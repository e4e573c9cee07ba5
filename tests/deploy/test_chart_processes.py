"""The chart's own processes, run for real: the api and worker containers' commands, arguments
and environment exactly as rendered (ConfigMap, Secret, env entries resolved), and the Redis
StatefulSet's server arguments, run as local processes. Only what must differ on this machine
is rewritten: mount paths to temp folders, the Redis address to the local server, container
ports to free ports. Then a client uploads (with the generated API key), KEDA's lists are seen
to hold the waiting job, a worker starts and ingests, the api answers, every probe path
answers on the port it names, and the metrics key from the Secret (the one the ServiceMonitor
presents) reads /metrics, whose series every dashboard and alert query must name: HTTP
responses by route template and status, the worker's ingested pages, the Redis queue lengths
the api reads at each scrape. Both event streams carry the headers that keep ingress-nginx from
buffering them.

A setting the chart sets that Settings does not know, a URL, port or path the processes do not
follow, fails here. Rendered with the cpu-demo example and the tiny builtin model (fast on CPU).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from lab.processes import free_port, start_redis
from tests.deploy import processes as pr
from tests.deploy.chart import CHART, Rendered, container, container_env, full, pod_spec, render
from worker.celery_app import ANSWER_QUEUE, INGEST_QUEUE

VALUES: dict[str, Any] = yaml.safe_load((CHART / "examples" / "cpu-demo.yaml").read_text())
VALUES["config"] = {**VALUES["config"], "model": "builtin:tiny-qwen2-vl"}
MONITORED = {**VALUES, "metrics": {"serviceMonitor": {"enabled": True},
                                   "prometheusRule": {"enabled": True}},
             "worker": {**VALUES["worker"], "autoscaling": {"keda": {"enabled": True}}}}


@dataclass
class Deployed:
    out: Rendered
    procs: dict[str, pr.Proc]
    logs: Path
    api_url: str
    redis: redis.Redis
    answer: dict[str, object]
    queued: dict[str, int]  # list name -> length while no worker ran
    collection_id: str
    scraped_queued: str  # the api's /metrics while no worker ran


def _mounts(workload: dict[str, Any], tmp: Path) -> dict[str, Path]:
    """Container mount path -> local folder: a claim is shared by every pod that mounts it,
    an emptyDir is the pod's own."""
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    out = {}
    for mount in container(workload)["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "persistentVolumeClaim" in volume:
            local = tmp / "claims" / volume["persistentVolumeClaim"]["claimName"]
        else:
            assert "emptyDir" in volume, volume
            local = tmp / workload["metadata"]["name"] / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        out[mount["mountPath"]] = local
    return out


def _local(out: Rendered, name: str, tmp: Path, redis_url: str) -> pr.Proc:
    """A Deployment's container as a local process."""
    workload = out.one("Deployment", full(name))
    c = container(workload)
    env = pr.rewrite_paths(container_env(out, c), _mounts(workload, tmp))
    svc = out.one("Service", full("redis"))
    env["CONDUIT_REDIS_URL"] = pr.rewrite_redis_url(
        env["CONDUIT_REDIS_URL"], redis_url, svc["metadata"]["name"],
        svc["spec"]["ports"][0]["port"])
    argv = pr.local_argv(c["command"] + c.get("args", []))
    ports = {}
    for port in c.get("ports", []):
        local = ports[port["name"]] = free_port()
        if "--port" in argv:  # the api: `conduit serve --port`
            argv = pr.rewrite_port_arg(argv, port["containerPort"], local)
        else:  # the worker: CONDUIT_WORKER_METRICS_PORT
            (key,) = [k for k, v in env.items() if k.endswith("_PORT")
                      and v == str(port["containerPort"])]
            env[key] = str(local)
    return pr.Proc(name, argv, env, ports)


def _local_redis(out: Rendered, tmp: Path) -> tuple[str, Any]:
    """The Redis StatefulSet's server arguments, less port, dir and password (given here)."""
    args = container(out.one("StatefulSet", full("redis")))["args"]
    assert args[0] == "redis-server"
    opts = dict(zip(args[1::2], args[2::2], strict=True))
    kept = [a for k, v in opts.items() if k not in ("--port", "--dir", "--requirepass")
            for a in (k, v)]
    return start_redis(tmp, args=kept, password=out.secret_data(full())["REDIS_PASSWORD"])


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    tmp = tmp_path_factory.mktemp("chart")
    logs = tmp / "logs"
    logs.mkdir()
    out = render(VALUES)
    redis_url, stop_redis = _local_redis(out, tmp)
    procs = {n: _local(out, n, tmp, redis_url) for n in ("api", "worker")}
    running: list[Any] = []
    try:
        running += pr.start([procs["api"]], logs)
        api_url = f"http://127.0.0.1:{procs['api'].ports['http']}"
        pr.wait_http(api_url + "/readyz", running, logs)
        api = pr.client(api_url, json.loads(out.secret_data(full())["CONDUIT_API_KEYS"])[0])
        collection_id, document_id = pr.upload(api)
        r = redis.Redis.from_url(redis_url)
        lists = [t["metadata"]["listName"] for t in _keda(render(MONITORED))["spec"]["triggers"]]
        queued = {name: int(r.llen(name)) for name in lists}  # type: ignore[arg-type]
        scraped_queued = httpx.get(api_url + "/metrics", headers=_metrics_auth(out)).text
        running += pr.start([procs["worker"]], logs)  # KEDA would wake it now
        answer = pr.ingest_then_ask(api, collection_id, document_id, logs)
        yield Deployed(out, procs, logs, api_url, r, answer, queued, collection_id,
                       scraped_queued)
    finally:
        pr.stop(running)
        stop_redis()


def _keda(out: Rendered) -> dict[str, Any]:
    return out.one("ScaledObject", full("worker"))


def test_the_rendered_processes_ingest_and_answer(deployed: Deployed) -> None:
    assert deployed.answer["answer"] is not None
    citations: list[dict[str, Any]] = deployed.answer["citations"]  # type: ignore[assignment]
    assert citations[0]["page"] == 1
    key = json.loads(deployed.out.secret_data(full())["CONDUIT_API_KEYS"])[0]
    info = httpx.get(deployed.api_url + "/v1/info", headers={"Authorization": f"Bearer {key}"})
    assert info.json()["model"] == "builtin:tiny-qwen2-vl" and info.json()["embedded"] is False
    # the chart's Redis arguments reached the server
    assert deployed.redis.config_get("maxmemory-policy")["maxmemory-policy"] == "volatile-lru"


def test_keda_watches_the_lists_the_jobs_wait_in(deployed: Deployed) -> None:
    """With no worker running, the uploaded document's job waited in a list KEDA reads."""
    assert deployed.queued[INGEST_QUEUE] == 1 and deployed.queued[ANSWER_QUEUE] == 0
    worker_argv = deployed.procs["worker"].argv
    consumed = worker_argv[worker_argv.index("--queues") + 1].split(",")
    assert sorted(consumed) == sorted(deployed.queued) == sorted([INGEST_QUEUE, ANSWER_QUEUE])
    assert deployed.redis.llen(INGEST_QUEUE) == 0  # the worker took it


def test_every_probe_answers_on_the_port_it_names(deployed: Deployed) -> None:
    for name in ("api", "worker"):
        c = container(deployed.out.one("Deployment", full(name)))
        urls = pr.probe_urls(c, deployed.procs[name].ports)
        expected = {"api": {"startupProbe", "readinessProbe", "livenessProbe"},
                    "worker": {"startupProbe", "livenessProbe"}}[name]
        assert set(urls) == expected, name
        for url in urls.values():
            assert httpx.get(url, timeout=10).status_code == 200, url


def test_scrape_annotations_name_the_served_ports(deployed: Deployed) -> None:
    for name, port in (("api", "http"), ("worker", "metrics")):
        workload = deployed.out.one("Deployment", full(name))
        notes = workload["spec"]["template"]["metadata"]["annotations"]
        declared = {p["name"]: p["containerPort"] for p in container(workload)["ports"]}
        assert int(notes["prometheus.io/port"]) == declared[port]
        local = deployed.procs[name].ports[port]
        assert httpx.get(f"http://127.0.0.1:{local}{notes['prometheus.io/path']}",
                         timeout=10, headers=_metrics_auth(deployed.out)).status_code == 200


def _metrics_auth(out: Rendered) -> dict[str, str]:
    """The bearer token the ServiceMonitor presents, read from the Secret it names."""
    sm = render(MONITORED).one("ServiceMonitor", full())
    (endpoint,) = [e for e in sm["spec"]["endpoints"] if "authorization" in e]
    ref = endpoint["authorization"]["credentials"]
    return {"Authorization": f"Bearer {out.secret_data(ref['name'])[ref['key']]}"}


def test_metrics_need_the_metrics_key(deployed: Deployed) -> None:
    url = deployed.api_url + "/metrics"
    assert httpx.get(url).status_code == 401
    tenant = json.loads(deployed.out.secret_data(full())["CONDUIT_API_KEYS"])[0]
    assert httpx.get(url, headers={"Authorization": f"Bearer {tenant}"}).status_code == 403
    r = httpx.get(url, headers=_metrics_auth(deployed.out))
    assert r.status_code == 200 and "conduit_queries_total" in r.text


def _scraped(deployed: Deployed) -> set[str]:
    api = httpx.get(deployed.api_url + "/metrics", headers=_metrics_auth(deployed.out)).text
    worker = httpx.get(f"http://127.0.0.1:{deployed.procs['worker'].ports['metrics']}/metrics")
    return pr.scraped_names(api) | pr.scraped_names(worker.text)


def test_every_dashboard_query_names_an_exported_series(deployed: Deployed) -> None:
    cm = deployed.out.one("ConfigMap", full("dashboard"))
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["conduit.json"])
    exported = _scraped(deployed)
    queries = list(pr.dashboard_queries(dashboard))
    assert len(queries) >= 15
    for query in queries:
        names = pr.promql_metric_names(query)
        assert names, query
        assert names <= exported, f"{sorted(names - exported)} not exported: {query}"


def test_every_alert_names_an_exported_series(deployed: Deployed) -> None:
    rule = render(MONITORED).one("PrometheusRule", full())
    exported = _scraped(deployed)
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert {"ConduitAnswerQueueStuck", "ConduitAnswerErrorsRising", "ConduitJobsWaiting",
            "ConduitServerErrorsRising"} <= {r["alert"] for r in alerts}
    for alert in alerts:
        names = pr.promql_metric_names(alert["expr"])
        assert names and names <= exported, (alert["alert"], sorted(names - exported))


def _tenant(deployed: Deployed) -> httpx.Client:
    return pr.client(deployed.api_url,
                     json.loads(deployed.out.secret_data(full())["CONDUIT_API_KEYS"])[0])


def test_event_streams_tell_a_proxy_not_to_buffer(deployed: Deployed) -> None:
    """Both server-sent event answers carry the headers ingress-nginx (X-Accel-Buffering)
    and any cache (Cache-Control) read as "pass it through as it comes"."""
    api = _tenant(deployed)
    asks = [("/v1/query/stream", {"collection_id": deployed.collection_id, "top_k": 1,
                                  "question": "When is the oil filter replaced?",
                                  "max_new_tokens": 2}),
            ("/v1/chat/completions", {"model": f"conduit:{deployed.collection_id}",
                                      "stream": True, "max_tokens": 2,
                                      "messages": [{"role": "user", "content": "Oil filter?"}]})]
    for path, body in asks:
        with api.stream("POST", path, json=body) as r:
            assert r.status_code == 200, (path, r.read())
            assert r.headers["content-type"].startswith("text/event-stream"), path
            assert r.headers.get("x-accel-buffering") == "no", (path, r.headers)
            assert r.headers.get("cache-control") == "no-cache", (path, r.headers)
            r.read()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_http_responses_are_counted_by_route_template_and_status(deployed: Deployed) -> None:
    api = _tenant(deployed)
    assert api.get("/v1/documents/doc-that-is-not-there").status_code == 404
    assert httpx.get(deployed.api_url + "/v1/collections").status_code == 401  # no key
    assert api.get("/no/such/path").status_code == 404
    scrape = _samples(httpx.get(deployed.api_url + "/metrics",
                                headers=_metrics_auth(deployed.out)).text)
    counts = {dict(labels)["route"] + " " + dict(labels)["method"] + " " +
              dict(labels)["status"]: value for (name, labels), value in scrape.items()
              if name == "conduit_http_requests_total"}
    assert counts["/v1/documents/{document_id} GET 404"] >= 1, counts
    assert counts["/v1/collections GET 401"] >= 1, counts  # refused before routing, still named
    assert counts["/v1/query POST 200"] >= 1, counts  # the fixture's answer
    assert counts["<unmatched> GET 404"] >= 1, counts  # raw paths do not become labels
    assert not any("doc-that-is-not-there" in k or "/no/such" in k for k in counts)


def test_ingested_pages_and_waiting_jobs_are_exported(deployed: Deployed) -> None:
    """The worker counts the pages it ingested; the api reads the Redis lists at each scrape."""
    worker = _samples(httpx.get(
        f"http://127.0.0.1:{deployed.procs['worker'].ports['metrics']}/metrics").text)
    assert worker[("conduit_ingest_pages_total", frozenset({("outcome", "ingested")}))] == \
        len(pr.PAGES)
    assert worker[("conduit_ingest_documents_total", frozenset({("outcome", "ready")}))] == 1
    def waiting(scrape: str) -> dict[str, float]:
        return {dict(labels)["queue"]: value for (name, labels), value in _samples(scrape).items()
                if name == "conduit_celery_queue_length"}

    # before any worker ran, the upload's job waited in its list; now every list is empty
    assert waiting(deployed.scraped_queued) == {INGEST_QUEUE: 1, ANSWER_QUEUE: 0}
    now = httpx.get(deployed.api_url + "/metrics", headers=_metrics_auth(deployed.out)).text
    assert waiting(now) == {INGEST_QUEUE: 0, ANSWER_QUEUE: 0}
