"""Checks of the chart's custom resources for what their APIs require, written from each API's
reference (kubernetes-validate ships schemas for built-in kinds only):

- KEDA `ScaledObject` / `TriggerAuthentication` (keda.sh/v1alpha1; keda.sh/docs "ScaledObject
  specification", "Redis Lists" scaler, "Authentication"): `spec.scaleTargetRef.name`;
  `spec.triggers[]` each with `type` and a string-to-string `metadata`; the redis scaler needs
  `listName` and an address (`address`, `host`+`port` or their `...FromEnv`), its numbers are
  strings; a trigger's `authenticationRef.name`; `secretTargetRef[]` of
  `parameter`, `name`, `key`.
- prometheus-operator `ServiceMonitor` / `PrometheusRule` (monitoring.coreos.com/v1, API
  reference): `spec.selector` and `spec.endpoints[]` naming a `port` (or `targetPort`), an
  `authorization` of `type` and `credentials.{name,key}`, durations in Prometheus' format;
  `spec.groups[]` with a unique `name` and `rules[]`, each with `expr` and exactly one of
  `alert` / `record`.
- Gateway API `HTTPRoute` (gateway.networking.k8s.io/v1): `spec.parentRefs[].name`,
  `rules[].backendRefs[]` with `name` and `port`, `timeouts.request` a Gateway API duration.
"""

from __future__ import annotations

import re
from typing import Any

PROM_DURATION = re.compile(r"^(0|(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?)$")
GATEWAY_DURATION = re.compile(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$")
API_VERSIONS = {
    "ScaledObject": "keda.sh/v1alpha1", "TriggerAuthentication": "keda.sh/v1alpha1",
    "ServiceMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1",
    "HTTPRoute": "gateway.networking.k8s.io/v1",
}


def _nonempty_str(value: Any, where: str) -> None:
    assert isinstance(value, str) and value, f"{where} must be a non-empty string: {value!r}"


def _string_map(value: Any, where: str) -> None:
    assert isinstance(value, dict), f"{where} must be a map"
    for k, v in value.items():
        assert isinstance(k, str) and isinstance(v, str), f"{where}.{k} must be a string: {v!r}"


def _scaled_object(spec: dict[str, Any]) -> None:
    _nonempty_str(spec["scaleTargetRef"].get("name"), "spec.scaleTargetRef.name")
    lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    assert isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi, (lo, hi)
    for key in ("pollingInterval", "cooldownPeriod"):
        assert isinstance(spec.get(key, 0), int), key
    triggers = spec["triggers"]
    assert isinstance(triggers, list) and triggers, "spec.triggers must not be empty"
    for i, trigger in enumerate(triggers):
        where = f"spec.triggers[{i}]"
        _nonempty_str(trigger.get("type"), f"{where}.type")
        _string_map(trigger.get("metadata"), f"{where}.metadata")
        if "authenticationRef" in trigger:
            _nonempty_str(trigger["authenticationRef"].get("name"),
                          f"{where}.authenticationRef.name")
        if trigger["type"] == "redis":
            meta = trigger["metadata"]
            _nonempty_str(meta.get("listName"), f"{where}.metadata.listName")
            assert any(k in meta for k in ("address", "addressFromEnv", "host", "hostFromEnv")), \
                f"{where}: the redis scaler needs an address"
            for key in ("listLength", "activationListLength", "databaseIndex"):
                if key in meta:
                    assert meta[key].isdigit(), f"{where}.metadata.{key}: {meta[key]!r}"
            if "enableTLS" in meta:
                assert meta["enableTLS"] in ("true", "false"), meta["enableTLS"]


def _trigger_authentication(spec: dict[str, Any]) -> None:
    refs = spec["secretTargetRef"]
    assert refs, "secretTargetRef must not be empty"
    for ref in refs:
        for key in ("parameter", "name", "key"):
            _nonempty_str(ref.get(key), f"secretTargetRef[].{key}")


def _service_monitor(spec: dict[str, Any]) -> None:
    selector = spec["selector"]
    assert set(selector) <= {"matchLabels", "matchExpressions"} and selector, selector
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] in ("In", "NotIn", "Exists", "DoesNotExist"), expr
    endpoints = spec["endpoints"]
    assert endpoints, "spec.endpoints must not be empty"
    for ep in endpoints:
        assert "port" in ep or "targetPort" in ep, ep
        for key in ("interval", "scrapeTimeout"):
            if key in ep:
                assert PROM_DURATION.match(ep[key]), (key, ep[key])
        if "authorization" in ep:
            auth = ep["authorization"]
            _nonempty_str(auth.get("type"), "authorization.type")
            _nonempty_str(auth["credentials"].get("name"), "authorization.credentials.name")
            _nonempty_str(auth["credentials"].get("key"), "authorization.credentials.key")
    for name in spec.get("namespaceSelector", {}).get("matchNames", []):
        _nonempty_str(name, "namespaceSelector.matchNames[]")


def _prometheus_rule(spec: dict[str, Any]) -> None:
    groups = spec["groups"]
    names = [g["name"] for g in groups]
    assert names and len(set(names)) == len(names), names
    for group in groups:
        assert group["rules"], group["name"]
        for rule in group["rules"]:
            _nonempty_str(rule.get("expr"), "rules[].expr")
            assert ("alert" in rule) != ("record" in rule), rule
            if "for" in rule:
                assert PROM_DURATION.match(rule["for"]), rule["for"]
            _string_map(rule.get("labels", {}), "rules[].labels")
            _string_map(rule.get("annotations", {}), "rules[].annotations")


def _http_route(spec: dict[str, Any]) -> None:
    assert spec["parentRefs"], "spec.parentRefs must not be empty"
    for ref in spec["parentRefs"]:
        _nonempty_str(ref.get("name"), "parentRefs[].name")
    for rule in spec["rules"]:
        for match in rule.get("matches", []):
            assert match["path"]["type"] in ("Exact", "PathPrefix", "RegularExpression"), match
        for backend in rule["backendRefs"]:
            _nonempty_str(backend.get("name"), "backendRefs[].name")
            assert isinstance(backend.get("port"), int), backend
        if "timeouts" in rule:
            assert GATEWAY_DURATION.match(rule["timeouts"]["request"]), rule["timeouts"]


_CHECKS = {"ScaledObject": _scaled_object, "TriggerAuthentication": _trigger_authentication,
           "ServiceMonitor": _service_monitor, "PrometheusRule": _prometheus_rule,
           "HTTPRoute": _http_route}


def check_custom_resource(doc: dict[str, Any]) -> None:
    """Fail (AssertionError, KeyError) unless `doc` has what its API requires."""
    kind = doc["kind"]
    assert doc["apiVersion"] == API_VERSIONS[kind], (kind, doc["apiVersion"])
    _nonempty_str(doc["metadata"].get("name"), f"{kind} metadata.name")
    try:
        _CHECKS[kind](doc["spec"])
    except KeyError as exc:
        raise AssertionError(f"{kind}/{doc['metadata']['name']}: missing {exc}") from exc
