"""The services `conduit-lab bench load` spawns: embedded (one process) or distributed (Redis,
Celery workers and the API) on a temporary home, with one of the answer engines.

Public API:
  ENGINES: engine name -> the environment that selects it;  FORMS, FORM_LABELS
  Service(url, pids, home, engines)          a running service: pids and model processes by role
  spawned(form, workers, engine, model, keep_logs) -> context manager of a Service
  service_settings(model) -> Settings        the settings such a service runs with
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from lab.processes import free_port, start_redis, stop_processes

if TYPE_CHECKING:
    from worker.settings import Settings


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the service exited during startup")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
    raise TimeoutError("the service did not start")


# the answer engine a spawned service runs: one answer at a time, or the batched default
ENGINES: dict[str, dict[str, str]] = {"serial": {"CONDUIT_MAX_ACTIVE_ANSWERS": "1"},
                                      "batched": {}}
FORMS = ("embedded", "distributed")
FORM_LABELS = {"embedded": "embedded", "distributed": "distributed (2 workers)"}


@dataclass
class Service:
    """A spawned service: its URL, pids by role, home, and model processes by role."""

    url: str
    pids: dict[str, list[int]]
    home: Path
    engines: dict[str, int]


@contextmanager
def spawned(form: str, workers: int = 2, engine: str = "batched", model: str | None = None,
            keep_logs: Path | None = None) -> Iterator[Service]:
    """A service on a temporary home: `form` embedded, or distributed (Redis + `workers`
    Celery workers + API), with the `engine` of `ENGINES` and `model` (None: the service's
    default). With `keep_logs`, its processes' logs are copied there when it stops
    (`<form>-<engine>-<name>.log`)."""
    with tempfile.TemporaryDirectory(prefix="conduit-load-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        env = {**os.environ, "CONDUIT_HOME": str(home), "HF_HUB_OFFLINE": "1",
               "CONDUIT_OCR": "false", **ENGINES[engine]}
        if model:
            env["CONDUIT_MODEL"] = model
        procs: list[subprocess.Popen[bytes]] = []
        stop_redis = None
        try:
            pids: dict[str, list[int]] = {"service": []}
            engines = {"service": 1}
            if form == "distributed":
                env["CONDUIT_REDIS_URL"], stop_redis = start_redis(Path(tmp))
                pids["workers"], engines = [], {"service": 0, "workers": workers}
                for i in range(workers):
                    w = subprocess.Popen([sys.executable, "-m", "service.cli", "worker",
                                          "--concurrency", "2"], env=env,
                                         stdout=open(home / f"worker{i}.log", "wb"),  # noqa: SIM115
                                         stderr=subprocess.STDOUT)
                    procs.append(w)
                    pids["workers"].append(w.pid)
            port = free_port()
            api = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port",
                                    str(port)], env=env,
                                   stdout=open(home / "server.log", "wb"),  # noqa: SIM115
                                   stderr=subprocess.STDOUT)
            procs.append(api)
            pids["service"].append(api.pid)
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, api)
            yield Service(url, pids, home, engines)
        finally:
            stop_processes(procs)
            if stop_redis:
                stop_redis()
            if keep_logs is not None:
                keep_logs.mkdir(parents=True, exist_ok=True)
                for log in home.glob("*.log"):
                    shutil.copy(log, keep_logs / f"{form}-{engine}-{log.name}")


def service_settings(model: str | None) -> Settings:
    """The `worker.settings.Settings` a service spawned from this process's environment with
    `model` (None: the default) runs with."""
    from worker.settings import Settings

    return Settings(model=model) if model else Settings()
