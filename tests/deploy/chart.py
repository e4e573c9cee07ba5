"""Render the Helm chart for real (helm-python-sdk: Helm v4's engine, no helm binary, no cluster)
and read the manifests: find objects, validate them against Kubernetes schemas, and rebuild the
`Settings` a container would see from its ConfigMap, Secret and env entries."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import helm_python as helm
import yaml
from kubernetes_validate import utils as kv

from worker.settings import GROUPS, Settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "conduit"
RELEASE, NAMESPACE = "rel", "ns"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.27.0", "1.37.0")


@dataclass
class Rendered:
    """The manifests of one render, parsed, plus NOTES.txt."""

    docs: list[dict[str, Any]]
    notes: str
    text: str

    def all(self, kind: str) -> list[dict[str, Any]]:
        """Every object of `kind`."""
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str) -> dict[str, Any]:
        """The single object of `kind` named `name`."""
        found = [d for d in self.all(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
        return found[0]

    def secret_data(self, name: str) -> dict[str, str]:
        """stringData of the chart's Secret `name`."""
        data: dict[str, str] = self.one("Secret", name).get("stringData", {})
        return data


def render(values: dict[str, Any] | None = None) -> Rendered:
    """Render the chart with `values` over its defaults (offline; `lookup` finds nothing)."""
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(files.items()):
        if path.endswith(".yaml"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    notes = files.get("conduit/templates/NOTES.txt", "")
    text = "\n".join(t for p, t in files.items() if p.endswith(".yaml"))
    return Rendered(docs=docs, notes=notes, text=text)


# Custom resources kubernetes-validate has no schema for: tests/deploy/crds.py checks them.
CRD_KINDS = frozenset({"ScaledObject", "TriggerAuthentication", "ServiceMonitor",
                       "PrometheusRule", "HTTPRoute"})


def validate(rendered: Rendered) -> None:
    """Validate every built-in manifest against the strict Kubernetes schemas (unknown fields
    fail), and every custom resource for the fields its API requires."""
    from tests.deploy.crds import check_custom_resource

    for doc in rendered.docs:
        if doc["kind"] in CRD_KINDS:
            check_custom_resource(doc)
            continue
        for version in KUBE_VERSIONS:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']} on "
                                     f"k8s {version}: {exc.message} at {list(exc.path)}") from exc


def full(name: str = "") -> str:
    """Full resource name of the release, with an optional suffix."""
    return f"{RELEASE}-conduit" + (f"-{name}" if name else "")


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Deployment or StatefulSet."""
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def container(doc: dict[str, Any]) -> dict[str, Any]:
    """The one container of a workload."""
    containers = pod_spec(doc)["containers"]
    assert len(containers) == 1
    c: dict[str, Any] = containers[0]
    return c


def env_entries(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A container's env entries by name."""
    return {e["name"]: e for e in c.get("env", [])}


def container_env(rendered: Rendered, c: dict[str, Any]) -> dict[str, str]:
    """The environment `c` gets: its ConfigMaps (envFrom), then env entries, with secretKeyRefs
    resolved from the rendered Secrets (refs to Secrets outside the chart are left out)."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(rendered.one("ConfigMap", source["configMapRef"]["name"])["data"])
    secrets = {s["metadata"]["name"]: s.get("stringData", {}) for s in rendered.all("Secret")}
    for name, entry in env_entries(c).items():
        if "value" in entry:
            env[name] = entry["value"]
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        if ref["key"] in secrets.get(ref["name"], {}):
            env[name] = secrets[ref["name"]][ref["key"]]
    return env


def settings_of(env: dict[str, str]) -> Settings:
    """The `Settings` a process with exactly `env` builds (validation errors raise). Every
    `CONDUIT_` name must be a real field: Settings ignores unknown names, so a misspelt
    one would otherwise pass silently."""
    for name in env:
        if name.startswith("CONDUIT_"):
            settings_field(name)
    with mock.patch.dict(os.environ, env, clear=True):
        return Settings()


def settings_field(env_name: str) -> str:
    """The Settings field an env name sets; fails unless it is a real field."""
    assert env_name.startswith("CONDUIT_"), env_name
    field = env_name.removeprefix("CONDUIT_").lower()
    assert field in FIELDS, f"{env_name} is not a field of Settings"
    return field


# every Settings field under its flat name (its environment name less `CONDUIT_`) -> its group
FIELDS = {name: group for group, model in GROUPS.items() for name in model.model_fields}


def setting(settings: Settings, name: str) -> Any:
    """The value of the field a flat name names, read from its group."""
    return getattr(getattr(settings, FIELDS[name]), name)
