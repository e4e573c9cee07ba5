"""The chart's production objects: each values example renders and validates; ingress, gateway,
autoscalers, monitoring objects and scheduling knobs carry what their APIs and the service
need."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.guard import FORM_OVERHEAD
from tests.deploy.chart import CHART, container, full, pod_spec, render, validate
from tests.deploy.crds import check_custom_resource
from worker.celery_app import ANSWER_QUEUE, INGEST_QUEUE
from worker.settings import Settings

EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
KEDA = {"worker": {"autoscaling": {"keda": {"enabled": True, "minReplicas": 0}}}}


def test_the_three_examples_are_there() -> None:
    assert {p.name for p in EXAMPLES} >= {"gpu-7b.yaml", "cpu-demo.yaml", "airgapped.yaml"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_each_example_renders_and_validates(example: Path) -> None:
    out = render(yaml.safe_load(example.read_text()))  # the values schema runs here
    validate(out)
    assert out.one("Deployment", full("worker"))


def test_the_gpu_example_asks_for_a_gpu_and_scales_on_the_queues() -> None:
    out = render(yaml.safe_load((CHART / "examples" / "gpu-7b.yaml").read_text()))
    worker = out.one("Deployment", full("worker"))
    assert container(worker)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "replicas" not in worker["spec"]  # KEDA owns it
    assert "replicas" not in out.one("Deployment", full("api"))["spec"]  # the HPA owns it
    hpa = out.one("HorizontalPodAutoscaler", full("api"))
    assert hpa["spec"]["scaleTargetRef"]["name"] == full("api")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_airgapped_reads_a_local_model_offline() -> None:
    out = render(yaml.safe_load((CHART / "examples" / "airgapped.yaml").read_text()))
    c = container(out.one("Deployment", full("worker")))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HF_HUB_OFFLINE"] == "1"
    assert out.one("ConfigMap", full())["data"]["CONDUIT_MODEL"].startswith(
        c["volumeMounts"][0]["mountPath"])
    assert pod_spec(out.one("Deployment", full("worker")))["runtimeClassName"] == "nvidia"


def test_keda_scales_the_worker_on_both_celery_lists_with_the_redis_password() -> None:
    out = render(KEDA)
    validate(out)
    so = out.one("ScaledObject", full("worker"))
    assert so["spec"]["scaleTargetRef"]["name"] == full("worker")
    assert so["spec"]["minReplicaCount"] == 0
    lists = {t["metadata"]["listName"] for t in so["spec"]["triggers"]}
    assert lists == {ANSWER_QUEUE, INGEST_QUEUE}
    address = so["spec"]["triggers"][0]["metadata"]["address"]
    assert address == f"{full('redis')}.ns.svc:6379"
    auth = out.one("TriggerAuthentication", full("redis"))
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": full(), "key": "REDIS_PASSWORD"}]
    assert all(t["authenticationRef"]["name"] == full("redis") for t in so["spec"]["triggers"])
    # the Redis NetworkPolicy lets the KEDA operator read the lists
    sources = out.one("NetworkPolicy", full("redis"))["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} \
        in sources


@pytest.mark.parametrize(("kind", "spec", "message"), [
    ("ScaledObject", {"triggers": [{"type": "redis", "metadata": {}}]}, "scaleTargetRef"),
    ("ScaledObject", {"scaleTargetRef": {"name": "w"},
                      "triggers": [{"type": "redis", "metadata": {"listLength": 4}}]},
     "must be a string"),
    ("ScaledObject", {"scaleTargetRef": {"name": "w"},
                      "triggers": [{"type": "redis", "metadata": {"address": "r:6379"}}]},
     "listName"),
    ("ServiceMonitor", {"endpoints": [{"port": "http"}]}, "selector"),
    ("ServiceMonitor", {"selector": {"matchLabels": {"a": "b"}},
                        "endpoints": [{"port": "http", "interval": "30 s"}]}, "interval"),
    ("PrometheusRule", {"groups": [{"name": "g", "rules": [{"alert": "A"}]}]}, "expr"),
    ("PrometheusRule", {"groups": [{"name": "g", "rules": [{"alert": "A", "record": "r",
                                                            "expr": "up"}]}]}, "alert"),
])
def test_the_custom_resource_checks_catch_missing_fields(kind: str, spec: dict[str, Any],
                                                          message: str) -> None:
    api = {"ScaledObject": "keda.sh/v1alpha1", "ServiceMonitor": "monitoring.coreos.com/v1",
           "PrometheusRule": "monitoring.coreos.com/v1"}[kind]
    doc = {"apiVersion": api, "kind": kind, "metadata": {"name": "x"}, "spec": spec}
    with pytest.raises(AssertionError, match=message):
        check_custom_resource(doc)


def test_ingress_fits_an_upload_streams_and_terminates_tls() -> None:
    values = {"ingress": {"enabled": True, "className": "nginx", "hosts": ["qa.example.com"],
                          "tlsSecretName": "qa-tls"}}
    out = render(values)
    validate(out)
    ing = out.one("Ingress", full())
    notes = ing["metadata"]["annotations"]
    body_mib = int(notes["nginx.ingress.kubernetes.io/proxy-body-size"].removesuffix("m"))
    # the service accepts uploads of max_upload_bytes plus the multipart overhead
    assert body_mib >= math.ceil((Settings().worker.max_upload_bytes + FORM_OVERHEAD) / 2**20)
    assert notes["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"  # SSE
    assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) > \
        Settings().worker.answer_timeout_s
    assert ing["spec"]["tls"] == [{"hosts": ["qa.example.com"], "secretName": "qa-tls"}]
    backend = ing["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": full("api"), "port": {"name": "http"}}
    bigger = render({**values, "config": {"max_upload_bytes": 512 * 2**20}})
    assert bigger.one("Ingress", full())["metadata"]["annotations"][
        "nginx.ingress.kubernetes.io/proxy-body-size"] == "514m"


def test_gateway_route_points_at_the_api_service() -> None:
    out = render({"gateway": {"enabled": True, "parentRefs": [{"name": "shared"}],
                              "hostnames": ["qa.example.com"], "requestTimeout": "660s"}})
    validate(out)
    rule = out.one("HTTPRoute", full())["spec"]["rules"][0]
    service = out.one("Service", full("api"))
    assert rule["backendRefs"] == [{"name": service["metadata"]["name"],
                                    "port": service["spec"]["ports"][0]["port"]}]
    assert rule["timeouts"] == {"request": "660s"}


def test_pdbs_and_spread_select_their_own_pods() -> None:
    out = render()
    for name in ("api", "worker"):
        workload = out.one("Deployment", full(name))
        labels = workload["spec"]["template"]["metadata"]["labels"]
        pdb = out.one("PodDisruptionBudget", full(name))
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["spec"]["maxUnavailable"] == 1  # a single replica can still be drained
        (spread,) = pod_spec(workload)["topologySpreadConstraints"]
        assert spread["labelSelector"]["matchLabels"] == workload["spec"]["selector"][
            "matchLabels"]
        assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # installs on one node


def test_monitoring_objects_are_optional_and_valid() -> None:
    plain = render()
    assert not plain.all("ServiceMonitor") and not plain.all("PrometheusRule")
    assert not plain.all("ScaledObject") and not plain.all("Ingress")
    out = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                              "prometheusRule": {"enabled": True}}})
    validate(out)
    sm = out.one("ServiceMonitor", full())
    assert sm["metadata"]["labels"]["release"] == "kps"
    ports = {e["port"] for e in sm["spec"]["endpoints"]}
    served = {p["name"] for s in out.all("Service") for p in s["spec"]["ports"]
              if s["metadata"]["name"] in (full("api"), full("worker-metrics"))}
    assert ports == served == {"http", "metrics"}
