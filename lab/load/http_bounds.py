"""What the connection bounds of `conduit serve` cost a request (`service/connections.py`).

`python -m lab.load.http_bounds --repeats 5 --out lab/load/results/http_bounds`: a trivial
ASGI app served by uvicorn with its plain httptools protocol and with the bounded one (the
deadlines, header count and connection cap), in turn, each in its own process on loopback;
a raw-socket client times requests over one kept-alive connection and requests that each
open a connection. Variants alternate within each repeat; the medians are reported.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lab.processes import free_port

REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
BODY = b'{"status": "ok"}'
_SERVER = """
import sys, uvicorn
from lab.load.http_bounds import app
from service.connections import ConnectionLimits, bounded_protocol
http = bounded_protocol(ConnectionLimits()) if sys.argv[2] == "bounded" else "httptools"
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), http=http, ws="none",
            log_level="warning", access_log=False)
"""


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The smallest JSON reply: what is timed is the protocol, not an endpoint."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


def _one(sock: socket.socket) -> None:
    sock.sendall(REQUEST)
    data = b""
    while not data.endswith(BODY):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed mid-reply")
        data += chunk


def _kept_alive(port: int, n: int) -> float:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        began = time.perf_counter()
        for _ in range(n):
            _one(sock)
        return n / (time.perf_counter() - began)


def _new_connections(port: int, n: int) -> float:
    began = time.perf_counter()
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            _one(sock)
    return n / (time.perf_counter() - began)


def _serve(variant: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(port), variant])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the {variant} server did not start")


def run(repeats: int, requests: int) -> dict[str, Any]:
    """Requests a second for both variants, `repeats` alternating runs each."""
    runs: dict[str, dict[str, list[float]]] = {
        v: {"kept_alive": [], "new_connection": []} for v in ("httptools", "bounded")}
    for _ in range(repeats):
        for variant, rates in runs.items():
            proc, port = _serve(variant)
            try:
                _kept_alive(port, 200)  # warm up
                rates["kept_alive"].append(_kept_alive(port, requests))
                rates["new_connection"].append(_new_connections(port, requests // 4))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    medians = {v: {k: statistics.median(r) for k, r in rates.items()}
               for v, rates in runs.items()}
    return {"repeats": repeats, "requests": requests, "runs": runs, "median": medians}


def markdown(result: dict[str, Any], command: str) -> str:
    """The result as a page: command, then one row per variant."""
    med = result["median"]
    rows = [f"| {v} | {med[v]['kept_alive']:.0f} | {med[v]['new_connection']:.0f} |"
            for v in ("httptools", "bounded")]
    ratio = [med["bounded"][k] / med["httptools"][k] for k in ("kept_alive", "new_connection")]
    return "\n".join([
        "# The connection bounds' cost per request", "", f"Command: `{command}`", "",
        f"Median of {result['repeats']} alternating runs; {result['requests']} requests over "
        f"one kept-alive connection, {result['requests'] // 4} each on a new connection; "
        "a trivial ASGI app, one uvicorn process, loopback, raw-socket client.", "",
        "| protocol | kept alive, requests/s | new connection, requests/s |",
        "|---|---:|---:|", *rows, "",
        f"bounded / httptools: {ratio[0]:.3f} kept alive, {ratio[1]:.3f} new connections.", ""])


def main(argv: list[str] | None = None) -> int:
    """Run, print the page, and write JSON and markdown when `--out` names a path stem."""
    p = argparse.ArgumentParser(prog="python -m lab.load.http_bounds", description=__doc__)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--out", type=Path, default=None, help="path stem of the .json and .md")
    args = p.parse_args(argv)
    result = run(args.repeats, args.requests)
    page = markdown(result, "python -m lab.load.http_bounds " + " ".join(argv or sys.argv[1:]))
    print(page)
    if args.out is not None:
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        args.out.with_suffix(".md").write_text(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
