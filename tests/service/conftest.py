"""A real `conduit serve` process on a free loopback port, with its home in a temp dir
(the helpers live in the lab, `lab/service_process.py`, which the lab's fuzz shares)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lab.processes import free_port as free_port
from lab.service_process import start_server as start_server
from lab.service_process import stop_server as stop_server
from lab.service_process import wait_ready as wait_ready


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(base URL, home dir) of a running embedded-mode server."""
    home = tmp_path_factory.mktemp("conduit-home")
    url, proc = start_server(home)
    yield url, home
    stop_server(proc)


@pytest.fixture(scope="module")
def client(server: tuple[str, Path]) -> httpx.Client:
    """A client of the module's server."""
    url, _ = server
    return httpx.Client(base_url=url, timeout=300)
