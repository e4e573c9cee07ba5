"""Start reader processes by forking a warm template process instead of a new interpreter.

A reader started with `subprocess` spends CPU starting Python and importing PyMuPDF before
it reads anything, and under load an upload waits mostly for that (measured:
lab/ingest/NOTES.md). The fork server is a process started once per parent process (lazily, with
the readers' minimal environment, `confine.child_env`), that imports what a reader needs and
then only forks: each request gets a fresh child that becomes one reader
(`worker.ingest.reader_child.main`) for one document, confines itself exactly as a started
reader does, and exits. The server never sees a document: it receives the child's pipes and
arguments, nothing else, so one document still cannot reach another's reader.

The parent holds a `ForkedReader` with the interface `PageReader` uses of a `Popen` (`pid`,
`stdin`, `stdout`, `poll`, `kill`, `wait`): the server passes back a pidfd of the child (a
kill can never reach a recycled pid) and, when the child ends, writes its exit status (as
`Popen.returncode` gives it: minus the signal) to a pipe the parent gave with the request.

Linux only (pidfds, `SCM_RIGHTS`); `start_reader` returns None where the server cannot run,
and the caller starts the reader with `subprocess`.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
import weakref
from typing import IO, Any

from worker.ingest.confine import child_env

log = logging.getLogger(__name__)

# PyMuPDF imports its layout-analysis add-on and pymupdf4llm when installed (most of a
# reader's start; pymupdf4llm imports onnxruntime, which starts a thread and opens a
# telemetry database); readers use neither, so both are kept out of them (and the server
# that forks them stays single-threaded).
READER_PREAMBLE = "import sys; sys.modules['pymupdf.layout'] = sys.modules['pymupdf4llm'] = None; "
_SERVER = READER_PREAMBLE + "from worker.ingest.fork_server import serve; serve(int(sys.argv[1]))"
_REPLY_BYTES = 4096
# the first request waits for the server to import PyMuPDF (over a minute on two busy cores)
_START_SECONDS = 300.0


class ForkedReader:
    """A reader process forked by the server: the parent's side of its pipes, its pidfd and
    the pipe its exit status arrives on. Like `Popen`, safe to poll, wait on and kill from
    several threads (a page thread and the one closing the reader)."""

    def __init__(self, pid: int, pidfd: int, stdin: IO[bytes], stdout: IO[bytes],
                 status_fd: int) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.returncode: int | None = None
        self._pidfd = pidfd  # open as long as this object: a kill never reaches another fd
        self._status_fd = status_fd  # -1 once read
        self._lock = threading.Lock()  # one thread at a time reads and closes the status pipe
        weakref.finalize(self, os.close, pidfd)

    def poll(self) -> int | None:
        """The exit status if the process ended (and the server reported it), else None
        (also while another thread waits for it, as `Popen.poll`)."""
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                self._update(block=False)
            finally:
                self._lock.release()
        return self.returncode

    def wait(self) -> int:
        """Block until the process ends; its exit status."""
        while self.returncode is None:
            with self._lock:
                if self.returncode is None:
                    self._update(block=True)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the process (through its pidfd: never another process)."""
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:  # already ended
                pass

    def _update(self, *, block: bool) -> None:
        timeout = None if block else 0
        if self._status_fd >= 0:
            if not select.select([self._status_fd], [], [], timeout)[0]:
                return
            # the server writes the status in one write of a few bytes, then closes the pipe
            status = os.read(self._status_fd, 64)
            os.close(self._status_fd)
            self._status_fd = -1
            if status:
                self.returncode = int(status)
                return
        # the server ended before the process did: its end is all that can be learnt
        if select.select([self._pidfd], [], [], timeout)[0]:
            self.returncode = -signal.SIGKILL


class _Server:
    """The parent's connection to its fork server (one per parent process)."""

    def __init__(self) -> None:
        # one message per request and reply, never split or merged
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER, str(child.fileno())],
                pass_fds=(child.fileno(),), env=child_env(None), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            child.close()
        parent.settimeout(_START_SECONDS)
        self.sock = parent
        self.pid = os.getpid()  # a forked parent (a prefork worker) starts its own server

    def fork(self, argv: list[str], tessdata: str | None, stderr_fd: int) -> ForkedReader:
        """Ask for one reader; raise OSError when the server is gone."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            request = json.dumps({"argv": argv, "tessdata": tessdata}).encode()
            socket.send_fds(self.sock, [request], [stdin_r, stdout_w, stderr_fd, status_w])
            reply, fds, _, _ = socket.recv_fds(self.sock, _REPLY_BYTES, 1)
        except BaseException:
            for fd in (stdin_w, stdout_r, status_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w, status_w):
                os.close(fd)
        if not reply or not fds:
            for fd in (stdin_w, stdout_r, status_r, *fds):
                os.close(fd)
            raise OSError(f"the fork server failed: {reply.decode(errors='replace')!r}")
        pid = int(json.loads(reply)["pid"])
        return ForkedReader(pid, fds[0], os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"),
                            status_r)

    def close(self) -> None:
        """Stop the server (its readers end when their pipes close)."""
        self.sock.close()
        if self.pid == os.getpid():  # not a server inherited through a fork
            self.proc.kill()
            self.proc.wait()


_lock = threading.Lock()
_server: _Server | None = None


def start_reader(argv: list[str], *, tessdata: str | None,
                 stderr: IO[bytes]) -> ForkedReader | None:
    """A reader process forked by this process's server (started at the first call, again
    when it died), or None when no server can run here (the caller then starts one)."""
    global _server
    if not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
        return None
    with _lock:
        for _ in range(2):  # a server that died since the last call is started again once
            try:
                if _server is not None and _server.pid != os.getpid():
                    _server.close()  # the parent process's server: keep out of it
                    _server = None
                if _server is None:
                    _server = _Server()
                return _server.fork(argv, tessdata, stderr.fileno())
            except OSError as exc:  # timeouts included
                log.warning("reader fork server unavailable (%s); starting it again", exc)
                if _server is not None:
                    _server.close()
                _server = None
    log.warning("reader fork server could not start; readers start as new processes")
    return None


def serve(sock_fd: int) -> None:
    """The fork server's loop: fork a reader per request until the parent closes the socket,
    reap the readers and send each one's exit status to its status pipe."""
    sock = socket.socket(fileno=sock_fd)
    # everything a reader imports, imported once here
    from worker.ingest import reader_child  # noqa: F401

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    status_fds: dict[int, int] = {}  # reader pid -> its status pipe
    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            while _drained(wake_r):
                pass
            _reap(status_fds)
        if sock.fileno() in ready:
            request, fds, _, _ = socket.recv_fds(sock, _REPLY_BYTES, 4)
            if not request:  # the parent is gone; its readers end when their pipes close
                return
            try:
                if len(fds) != 4:
                    raise OSError(f"a request with {len(fds)} descriptors")
                pid = os.fork()
            except OSError as exc:
                for fd in fds:
                    os.close(fd)
                sock.sendall(json.dumps({"error": str(exc)}).encode())
                continue
            if pid == 0:
                _become_reader(json.loads(request), fds)
            pidfd = os.pidfd_open(pid)  # the child cannot be reaped before _reap below
            try:
                socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
            except OSError:
                return
            finally:
                os.close(pidfd)
            status_fds[pid] = fds[3]
            for fd in fds[:3]:
                os.close(fd)
            _reap(status_fds)


def _drained(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _reap(status_fds: dict[int, int]) -> None:
    """Collect every ended reader and send its exit status (then close its status pipe)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status_fds.pop(pid, None)
        if fd is not None:
            try:
                os.write(fd, str(os.waitstatus_to_exitcode(status)).encode())
            except OSError:  # the parent closed its end: nobody is waiting
                pass
            os.close(fd)


def _become_reader(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: take the given pipes as descriptors 0-2, drop every other
    descriptor the server holds, and run one reader. Never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        os.closerange(3, _max_fd() + 1)
        if request.get("tessdata"):
            os.environ["TESSDATA_PREFIX"] = str(request["tessdata"])
        else:
            os.environ.pop("TESSDATA_PREFIX", None)
        from worker.ingest.reader_child import main

        code = main([str(a) for a in request["argv"]])
    except BaseException:  # noqa: BLE001 - report to the log file, exit non-zero
        try:
            os.write(2, traceback.format_exc().encode(errors="replace"))
        except OSError:
            pass
    finally:
        os._exit(code)


def _max_fd() -> int:
    """The highest open descriptor of this process (from /proc, else a safe bound)."""
    try:
        return max(int(name) for name in os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        return 4096
