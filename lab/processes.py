"""Local processes the lab's benches and the tests start: a real `redis-server`
(`start_redis(dir)`), a free loopback port, and stopping spawned services.

The Redis server listens on a free loopback port, keeps no data on disk (`--save ''
--appendonly no`), runs in `tmp_path`, and is stopped by its PID. The tests use it too
(`from lab.processes import start_redis`; tests may import the lab, the product may not):
`start_redis(tmp_path)` returns `(url, stop)`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import redis


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process still running, then wait (SIGKILL after 30 s)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_redis(tmp_path: Path, *, port: int | None = None, args: Sequence[str] = (),
                password: str | None = None, url: str | None = None,
                ping_kwargs: dict[str, object] | None = None,
                timeout_s: float = 10.0) -> tuple[str, Callable[[], None]]:
    """Start redis-server; return its URL and a function that stops it (idempotent).

    `port` pins the port (e.g. to restart a server on the same address); `args` are extra
    server arguments (e.g. `["--maxmemory", "20mb"]`); `password` sets `requirepass` and goes
    into the URL; `url`/`ping_kwargs` override the URL and client options used to wait for the
    first PING (for TLS setups that listen on another port).
    """
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    for _ in range(5):
        p = port or free_port()
        workdir = tmp_path / f"redis-{p}"
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = [exe, "--port", str(p), "--bind", "127.0.0.1", "--save", "", "--appendonly",
               "no", "--dir", str(workdir), "--logfile", str(workdir / "redis.log"), *args]
        if password:
            cmd += ["--requirepass", password]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        auth = f":{password}@" if password else ""
        server_url = url or f"redis://{auth}127.0.0.1:{p}/0"
        if _wait_ready(proc, server_url, timeout_s, ping_kwargs or {}):
            return server_url, _stopper(proc)
        _stopper(proc)()
        if port is not None:
            break
    log = (workdir / "redis.log")
    detail = log.read_text()[-2000:] if log.exists() else ""
    raise RuntimeError(f"redis-server did not start: {detail}")


def _wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float,
                kwargs: dict[str, object]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=0.5, **kwargs)
            try:
                if client.ping():
                    return True
            finally:
                client.close()
        except redis.RedisError:
            time.sleep(0.05)
    return False


def _stopper(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
    return stop
