"""The chart rendered with its default values: valid Kubernetes objects that mean what they say."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import helm_python as helm
import pytest

from service.cli import _parser
from tests.deploy.chart import (
    CHART,
    ROOT,
    Rendered,
    container,
    container_env,
    env_entries,
    full,
    pod_spec,
    render,
    settings_of,
    validate,
)


@pytest.fixture(scope="module")
def out() -> Rendered:
    return render()


def test_every_manifest_is_a_valid_kubernetes_object(out: Rendered) -> None:
    validate(out)
    kinds = sorted(d["kind"] for d in out.docs)
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "Deployment", "NetworkPolicy",
                     "PersistentVolumeClaim", "PodDisruptionBudget", "PodDisruptionBudget",
                     "Secret", "Service", "Service", "Service", "StatefulSet"]


def test_helm_lint_is_clean() -> None:
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_worker_runs_conduit_worker_and_api_runs_conduit_serve(out: Rendered) -> None:
    worker = container(out.one("Deployment", full("worker")))
    args = _parser().parse_args(worker["command"][1:])
    assert worker["command"][0] == "conduit"
    assert args.func.__name__ == "_worker" and args.concurrency == 2

    api = container(out.one("Deployment", full("api")))
    args = _parser().parse_args(api["command"][1:])
    assert args.func.__name__ == "_serve" and args.host == "0.0.0.0"
    assert api["ports"] == [{"name": "http", "containerPort": args.port, "protocol": "TCP"}]
    service = out.one("Service", full("api"))
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_api_and_worker_mount_the_same_rwx_claim_at_conduit_home(out: Rendered) -> None:
    claim = out.one("PersistentVolumeClaim", full("home"))
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for name in ("api", "worker"):
        workload = out.one("Deployment", full(name))
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        c = container(workload)
        home = container_env(out, c)["CONDUIT_HOME"]
        mounts = [m for m in c["volumeMounts"] if m["mountPath"] == home]
        assert len(mounts) == 1, name
        claim_ref = volumes[mounts[0]["name"]]["persistentVolumeClaim"]["claimName"]
        assert claim_ref == claim["metadata"]["name"], name


def test_redis_url_points_at_the_bundled_redis_with_its_password(out: Rendered) -> None:
    secret = out.secret_data(full())
    url = urlsplit(secret["CONDUIT_REDIS_URL"])
    redis_svc = out.one("Service", full("redis"))
    redis = out.one("StatefulSet", full("redis"))
    assert url.scheme == "redis" and url.hostname == redis_svc["metadata"]["name"]
    assert url.port == redis_svc["spec"]["ports"][0]["port"]
    assert re.fullmatch(r"[A-Za-z0-9]{32}", secret["REDIS_PASSWORD"])
    assert url.password == secret["REDIS_PASSWORD"]
    # Redis requires that same password, read from the same Secret key
    rc = container(redis)
    assert rc["args"][rc["args"].index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert env_entries(rc)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == \
        {"name": full(), "key": "REDIS_PASSWORD"}
    assert redis["spec"]["serviceName"] == redis_svc["metadata"]["name"]
    assert redis_svc["spec"]["selector"].items() <= \
        redis["spec"]["template"]["metadata"]["labels"].items()
    for name in ("api", "worker"):
        ref = env_entries(container(out.one("Deployment", full(name))))["CONDUIT_REDIS_URL"]
        assert ref == {"name": "CONDUIT_REDIS_URL",
                       "valueFrom": {"secretKeyRef": {"name": full(), "key": "CONDUIT_REDIS_URL"}}}


def test_redis_evicts_only_page_kv_and_persists(out: Rendered) -> None:
    args = container(out.one("StatefulSet", full("redis")))["args"]
    opts = dict(zip(args[1::2], args[2::2], strict=True))
    assert opts["--maxmemory"] == "4gb"
    assert opts["--maxmemory-policy"] == "volatile-lru" and opts["--appendonly"] == "yes"
    ttl = out.one("ConfigMap", full())["data"]["CONDUIT_REDIS_KV_TTL_S"]
    assert int(ttl) > 0  # page KV has a TTL, metadata has none: only page KV is evictable
    policy = out.one("NetworkPolicy", full("redis"))["spec"]["ingress"][0]["from"][0]
    components = {e["key"]: e["values"] for e in policy["podSelector"]["matchExpressions"]}
    assert components["app.kubernetes.io/component"] == ["api", "worker"]


def test_an_api_key_and_a_metrics_key_are_generated_into_the_secret(out: Rendered) -> None:
    api = env_entries(container(out.one("Deployment", full("api"))))
    for name in ("CONDUIT_API_KEYS", "CONDUIT_METRICS_KEY"):
        assert "value" not in api[name]
        assert api[name]["valueFrom"]["secretKeyRef"] == {"name": full(), "key": name}
    secret = out.secret_data(full())
    (key,) = json.loads(secret["CONDUIT_API_KEYS"])
    assert re.fullmatch(r"[A-Za-z0-9]{40}", key) and secret["GENERATED_API_KEY"] == key
    assert re.fullmatch(r"[A-Za-z0-9]{40}", secret["CONDUIT_METRICS_KEY"]) and \
        secret["CONDUIT_METRICS_KEY"] != key
    worker = env_entries(container(out.one("Deployment", full("worker"))))
    assert "CONDUIT_API_KEYS" not in worker and "CONDUIT_METRICS_KEY" not in worker
    assert "GENERATED_API_KEY}' | base64 -d" in out.notes
    # generated once: a second install draws other keys (upgrades read them back via lookup)
    assert json.loads(render().secret_data(full())["CONDUIT_API_KEYS"]) != [key]
    s = settings_of(container_env(out, container(out.one("Deployment", full("api")))))
    assert [k.get_secret_value() for k in s.service.api_keys] == [key]
    assert s.service.metrics_key is not None and s.service.metrics_key.get_secret_value() == \
        secret["CONDUIT_METRICS_KEY"]


def test_probes_hit_routes_the_app_serves(out: Rendered) -> None:
    from service.routers.health import router  # imports torch: seconds, once per session

    routes = {getattr(r, "path", None) for r in router.routes}
    api = container(out.one("Deployment", full("api")))
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert api["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {"/readyz", "/healthz"} <= routes


def test_pods_run_as_the_image_user_without_privileges(out: Rendered) -> None:
    found = re.search(r"useradd .*--uid (\d+)", (ROOT / "deploy" / "Dockerfile").read_text())
    assert found is not None
    uid = int(found[1])
    for name in ("api", "worker"):
        workload = out.one("Deployment", full(name))
        pod = pod_spec(workload)["securityContext"]
        assert pod["runAsUser"] == uid == pod["fsGroup"] and pod["runAsNonRoot"] is True
        sc = container(workload)["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        # the root filesystem is read-only: /tmp is writable and HOME points there
        assert sc["readOnlyRootFilesystem"] is True
        assert container_env(out, container(workload))["HOME"] == "/tmp"
        assert any(m["mountPath"] == "/tmp" for m in container(workload)["volumeMounts"])
        assert pod_spec(workload)["automountServiceAccountToken"] is False


def test_env_names_are_settings_fields_and_parse(out: Rendered) -> None:
    secret = out.secret_data(full())
    for name, device in (("api", "cpu"), ("worker", "cuda")):
        env = container_env(out, container(out.one("Deployment", full(name))))
        s = settings_of(env)
        assert str(s.storage.home) == "/data" and s.storage.redis_url == secret["CONDUIT_REDIS_URL"]
        assert s.core.device == device and not s.embedded
        assert s.core.model == "builtin:small-qwen2-vl" and s.storage.redis_kv_ttl_s == 604800
        assert bool(s.service.api_keys) == (name == "api")


def test_the_worker_gets_a_gpu_and_the_api_does_not_by_default(out: Rendered) -> None:
    worker = out.one("Deployment", full("worker"))
    assert container(worker)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        pod_spec(worker)["tolerations"]
    # Celery drains the running job on SIGTERM: give it longer than the ingest deadline
    assert pod_spec(worker)["terminationGracePeriodSeconds"] > 600
    api = container(out.one("Deployment", full("api")))
    assert "nvidia.com/gpu" not in api["resources"].get("limits", {})


def test_selectors_match_their_pods(out: Rendered) -> None:
    for workload in out.all("Deployment") + out.all("StatefulSet"):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
    api_labels = out.one("Deployment", full("api"))["spec"]["template"]["metadata"]["labels"]
    assert out.one("Service", full("api"))["spec"]["selector"].items() <= api_labels.items()
    worker_labels = out.one("Deployment", full("worker"))["spec"]["selector"]["matchLabels"]
    assert worker_labels != out.one("Deployment", full("api"))["spec"]["selector"]["matchLabels"]


def test_config_changes_roll_the_pods(out: Rendered) -> None:
    changed = render({"config": {"budget": 0.2}})

    def checksum(r: Rendered, name: str) -> str:
        annotations = r.one("Deployment", full(name))["spec"]["template"]["metadata"]
        return str(annotations["annotations"]["checksum/config"])

    for name in ("api", "worker"):
        assert checksum(out, name) != checksum(changed, name)
    assert checksum(out, "api") == checksum(render(), "api")
