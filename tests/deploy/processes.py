"""Run a deployment's own processes on this machine: the container commands, arguments and
environment a manifest or compose file gives, with only what must differ locally rewritten
(mount paths to temp folders, the Redis address to a local redis-server, listen ports to free
ports), then drive them over HTTP as a client would and read their metrics.

Nothing of the test runner's environment leaks into a process but PATH and the offline hub
switches: a `CONDUIT_*` variable the deployment does not set stays unset, as in a container.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lab.processes import stop_processes
from tests.deploy.chart import settings_of
from tests.pdfs import text_pdf

BIN = Path(sys.executable).parent
BASE_ENV = {"PATH": f"{BIN}:/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "LANG": "C.UTF-8"}
PAGES = ["Engine maintenance schedule: replace the oil filter every 500 hours.",
         "Cabin crew roster for the winter season and holiday rotations."]
# Suffixes a scrape shows for a family of each type (prometheus_client names).
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                              "_created"),
             "summary": ("_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",)}


@dataclass
class Proc:
    """One process of a deployment: its argv and environment, as rewritten to run here."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ports: dict[str, int] = field(default_factory=dict)  # container port name -> local port


def local_argv(command: list[str]) -> list[str]:
    """The container command with its executable resolved to this environment's scripts."""
    exe = BIN / command[0]
    assert exe.exists(), f"{command[0]} is not installed in {BIN}"
    return [str(exe), *command[1:]]


def rewrite_paths(env: dict[str, str], mounts: dict[str, Path]) -> dict[str, str]:
    """`env` with every value under a container mount path moved under its local folder."""
    out = {}
    for name, value in env.items():
        for mount, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if value == mount or value.startswith(mount.rstrip("/") + "/"):
                value = str(local) + value[len(mount.rstrip("/")):]
                break
        out[name] = value
    return out


def rewrite_redis_url(url: str, local_url: str, host: str, port: int) -> str:
    """`url` (which must name `host`:`port`) pointed at the local server, all else kept."""
    parts = urlsplit(url)
    assert (parts.hostname, parts.port or 6379) == (host, port), \
        f"the Redis URL {parts.hostname}:{parts.port} does not name {host}:{port}"
    local = urlsplit(local_url)
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{auth}{local.hostname}:{local.port}"))


def rewrite_port_arg(argv: list[str], container_port: int, local_port: int) -> list[str]:
    """argv with the value of `--port` (which must be the container port) made local."""
    i = argv.index("--port") + 1
    assert argv[i] == str(container_port), (argv, container_port)
    return [*argv[:i], str(local_port), *argv[i + 1:]]


def start(procs: list[Proc], logs: Path) -> list[subprocess.Popen[bytes]]:
    """Start each process (after checking its `CONDUIT_*` names are Settings fields and parse);
    their output goes to logs/<name>.log."""
    running = []
    for p in procs:
        settings_of({k: v for k, v in p.env.items() if k.startswith("CONDUIT_")})
        log = open(logs / f"{p.name}.log", "wb")  # noqa: SIM115 - closed with the process
        running.append(subprocess.Popen(p.argv, env=BASE_ENV | p.env, stdout=log,
                                        stderr=subprocess.STDOUT, cwd=logs))
    return running


def log_tail(logs: Path) -> str:
    """The end of every process log, for failure messages."""
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}"
                     for f in sorted(logs.glob("*.log")))


def wait_http(url: str, procs: list[subprocess.Popen[bytes]], logs: Path,
              timeout_s: float = 240, headers: dict[str, str] | None = None) -> httpx.Response:
    """Poll `url` until it answers 200; fail with the logs if a process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        dead = [p.args for p in procs if p.poll() is not None]
        assert not dead, f"exited: {dead}\n{log_tail(logs)}"
        try:
            r = httpx.get(url, timeout=5, headers=headers)
            if r.status_code == 200:
                return r
            last = r.status_code
        except httpx.TransportError as exc:
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer 200 ({last})\n{log_tail(logs)}")


def probe_urls(container: dict[str, object], ports: dict[str, int]) -> dict[str, str]:
    """URL of each httpGet probe the container declares, on the local port of the port it names
    (a name or a number)."""
    declared = {p["name"]: p["containerPort"] for p in container.get("ports", [])}  # type: ignore[attr-defined]
    out = {}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if not probe:
            continue
        get = probe["httpGet"]  # type: ignore[index]
        name = get["port"] if isinstance(get["port"], str) else \
            next(n for n, port in declared.items() if port == get["port"])
        out[kind] = f"http://127.0.0.1:{ports[name]}{get['path']}"
    return out


def client(base_url: str, api_key: str) -> httpx.Client:
    """An HTTP client of the api with a tenant's key."""
    return httpx.Client(base_url=base_url, timeout=300,
                        headers={"Authorization": f"Bearer {api_key}"})


def upload(api: httpx.Client) -> tuple[str, str]:
    """Create a collection and upload a two-page PDF; (collection id, document id)."""
    col = api.post("/v1/collections", json={"name": "fleet"})
    assert col.status_code in (200, 201), col.text
    collection_id = col.json()["collection_id"]
    r = api.post(f"/v1/collections/{collection_id}/documents",
                 files={"file": ("fleet.pdf", text_pdf(PAGES), "application/pdf")})
    assert r.status_code == 202, r.text
    return collection_id, r.json()["document_id"]


def ingest_then_ask(api: httpx.Client, collection_id: str, document_id: str,
                    logs: Path) -> dict[str, object]:
    """Wait until the document is ready, then ask about it; the answer body."""
    deadline = time.monotonic() + 240
    while (doc := api.get(f"/v1/documents/{document_id}").json())["status"] \
            not in ("ready", "failed"):
        assert time.monotonic() < deadline, f"not ingested: {doc}\n{log_tail(logs)}"
        time.sleep(0.3)
    assert doc["status"] == "ready", f"{doc}\n{log_tail(logs)}"
    out = api.post("/v1/query", json={"collection_id": collection_id, "top_k": 1,
                                      "question": "When is the oil filter replaced?",
                                      "max_new_tokens": 4})
    assert out.status_code == 200, f"{out.text}\n{log_tail(logs)}"
    body: dict[str, object] = out.json()
    return body


def scraped_names(text: str) -> set[str]:
    """Every series name a Prometheus scrape could show for the families in `text` (families
    without samples yet count with their type's suffixes)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(s.name for s in family.samples)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return names


_PROMQL_WORDS = frozenset("""sum avg min max count stddev stdvar topk bottomk quantile
count_values group rate irate increase delta idelta deriv histogram_quantile clamp_min
clamp_max abs ceil floor round sqrt exp ln log2 log10 time vector scalar label_replace
label_join absent absent_over_time sum_over_time avg_over_time max_over_time min_over_time
by without on ignoring group_left group_right and or unless bool offset inf nan
label_values""".split())


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression (PromQL, or a Grafana `label_values(...)` query) selects:
    identifiers less functions, keywords, label names in by/on/... and matchers, durations
    and Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)             # strings
    text = re.sub(r"\{[^}]*\}", "", text)                      # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)                     # ranges
    text = re.sub(r"\$\{?\w+\}?", "", text)                    # Grafana variables
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1",
                  text)
    text = re.sub(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)", r"\1", text)
    words = set(re.findall(r"[A-Za-z_:][\w:]*", text))
    return {w for w in words if w.lower() not in _PROMQL_WORDS and not re.fullmatch(r"e\d*", w)}


def dashboard_queries(dashboard: dict[str, object]) -> Iterator[str]:
    """Every PromQL query of a Grafana dashboard: panel targets and query variables."""
    for panel in dashboard.get("panels", []):  # type: ignore[attr-defined]
        for target in panel.get("targets", []):
            yield target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):  # type: ignore[attr-defined]
        if var.get("type") == "query":
            query = var["query"]
            yield query["query"] if isinstance(query, dict) else query


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop the processes this module started (SIGTERM, then SIGKILL)."""
    stop_processes(procs)
