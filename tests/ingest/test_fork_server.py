"""Readers forked by the fork server: one server per process, a fresh child per document that
holds only its own pipes, exit statuses that reach the parent, a dead server replaced, a
forked parent that keeps out of its parent's server, and the started path where asked."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from lab.ingest.builders import text_pages_pdf
from worker.ingest import PageMemoryLimitError, ReaderLimits, fork_server
from worker.ingest.sandbox import PageReader
from worker.ingest.text import TextPolicy

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _fds(pid: int) -> set[int]:
    return {int(name) for name in os.listdir(f"/proc/{pid}/fd")}


def _text(reader: PageReader) -> str:
    page = reader.read(0, render=True, dpi=40, max_pixels=10**6, ocr=False, policy=TextPolicy())
    assert page.image is not None and page.error is None
    return page.text.text


def test_readers_are_forked_by_one_server_and_hold_only_their_own_pipes() -> None:
    with PageReader(text_pages_pdf(["The ferry leaves at nine."]), password=None,
                    limits=ReaderLimits()) as first, \
            PageReader(text_pages_pdf(["Tide tables at noon."]), password=None,
                       limits=ReaderLimits()) as second:
        server = _parent(first.pid)
        assert server != os.getpid() and _parent(second.pid) == server
        assert first.pid != second.pid
        # one thread to fork from: nothing it imported (onnxruntime, through pymupdf4llm)
        # runs a thread whose locks a child could inherit held
        assert "\nThreads:\t1\n" in Path(f"/proc/{server}/status").read_text()
        # requests, replies, the log file, and the reply pipe the reader duplicates: nothing
        # of the server's (its socket, other readers' status pipes) or of this process's
        assert _fds(first.pid) == _fds(second.pid) == {0, 1, 2, 3}
        assert "rlimits" in first.facts.confinement.split(",")
        assert _text(first) == "The ferry leaves at nine."
        assert _text(second) == "Tide tables at noon."
    assert not Path(f"/proc/{first.pid}").exists()  # ended and reaped by the server


def test_a_readers_exit_status_reaches_the_parent() -> None:
    reader = PageReader(text_pages_pdf(["Harbour dues"]), password=None, limits=ReaderLimits())
    os.kill(reader.pid, signal.SIGTERM)
    with pytest.raises(PageMemoryLimitError, match="signal 15"):
        _text(reader)
    reader.close()


def test_a_dead_server_is_replaced_and_its_readers_finish() -> None:
    reader = PageReader(text_pages_pdf(["one"]), password=None, limits=ReaderLimits())
    server = _parent(reader.pid)
    os.kill(server, signal.SIGKILL)
    assert _text(reader) == "one"  # its pipes are its own: it reads on without the server
    assert reader.alive
    reader.close()  # killed through its pidfd; no exit status to wait for
    assert not reader.alive
    with PageReader(text_pages_pdf(["two"]), password=None, limits=ReaderLimits()) as reader:
        assert _parent(reader.pid) not in (server, os.getpid())
        assert _text(reader) == "two"


def test_a_forked_parent_starts_its_own_server() -> None:
    with PageReader(text_pages_pdf(["one"]), password=None, limits=ReaderLimits()) as reader:
        ours = _parent(reader.pid)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the forked test process
        code = 1
        try:
            with PageReader(text_pages_pdf(["two"]), password=None,
                            limits=ReaderLimits()) as inner:
                os.write(write_end, f"{_parent(inner.pid)} {_text(inner)}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    reply = os.read(read_end, 100).decode()
    os.close(read_end)
    assert os.waitpid(child, 0)[1] == 0
    server, text = reply.split(" ", 1)
    assert text == "two" and int(server) not in (ours, child, os.getpid())
    with PageReader(text_pages_pdf(["three"]), password=None, limits=ReaderLimits()) as reader:
        assert _parent(reader.pid) == ours  # ours is untouched by the child's


def test_started_readers_where_asked() -> None:
    with PageReader(text_pages_pdf(["one"]), password=None, limits=ReaderLimits(),
                    fork_server=False) as reader:
        assert _parent(reader.pid) == os.getpid()
        assert not isinstance(reader._proc, fork_server.ForkedReader)
        assert _text(reader) == "one"


def test_several_threads_wait_for_one_reader() -> None:
    """A page thread and the thread closing the reader both wait for its end (as
    `iter_pages` does past its deadline): each gets the status, none reads a closed pipe."""
    for _ in range(3):
        reader = PageReader(text_pages_pdf(["Harbour dues"]), password=None,
                            limits=ReaderLimits())
        proc = reader._proc
        assert isinstance(proc, fork_server.ForkedReader)
        statuses: list[int] = []
        errors: list[BaseException] = []

        def wait(proc: fork_server.ForkedReader = proc, spin: bool = False,
                 statuses: list[int] = statuses, errors: list[BaseException] = errors) -> None:
            try:
                while spin and proc.poll() is None:
                    pass
                statuses.append(proc.wait())
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

        threads = [threading.Thread(target=wait, kwargs={"spin": i % 2 == 1})
                   for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.2)  # two threads blocked in wait(), two polling, when the reader ends
        os.kill(reader.pid, signal.SIGTERM)
        for t in threads:
            t.join()
        reader.close()
        assert not errors and statuses == [-signal.SIGTERM] * 4
