"""The processes that parse PDFs hold no secret and are confined (issue 30, points 1 and 4):
a minimal environment, no network, no file outside Python's and the system's, CPU-time and
file-size limits; no signal or socket reaching another process (issue 60, point 5); and the
object-stream bomb is refused at open, never inflated here."""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lab.ingest.builders import text_pages_pdf
from lab.ingest.objstm_bomb import objstm_bomb_pdf
from worker.ingest import OpenMemoryLimitError, ReaderLimits, iter_pages
from worker.ingest.confine import child_env
from worker.ingest.sandbox import PageReader
from worker.uploads import check_upload

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
SECRETS = {"CONDUIT_API_KEYS": '["tenant-key-5f1e"]', "CONDUIT_METRICS_KEY": "ops-key-77a0",
           "CONDUIT_REDIS_URL": "redis://:hunter2-pass@127.0.0.1:6379/0",
           "AWS_SECRET_ACCESS_KEY": "aws-secret-9c3d"}


def _landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


@linux
def test_a_reader_process_holds_no_key_or_password(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    with PageReader(text_pages_pdf(["The ferry leaves at nine."]), password=None,
                    limits=ReaderLimits()) as reader:
        environ = Path(f"/proc/{reader.pid}/environ").read_bytes().decode()
        assert reader.facts.page_count == 1
    names = {entry.partition("=")[0] for entry in environ.split("\0") if entry}
    assert "PYTHONPATH" in names
    assert not any(name.startswith(("CONDUIT_", "AWS_", "REDIS")) for name in names), names
    for value in SECRETS.values():
        assert value not in environ
    assert "hunter2" not in environ


@linux
def test_a_reader_reports_its_confinement() -> None:
    with PageReader(text_pages_pdf(["Tide tables"]), password=None,
                    limits=ReaderLimits()) as reader:
        applied = reader.facts.confinement.split(",")
    assert "rlimits" in applied
    if _landlock_abi() >= 1:
        assert "landlock-fs" in applied
    if _landlock_abi() >= 4:
        assert "landlock-tcp" in applied
    if _landlock_abi() >= 6:
        assert "landlock-scope" in applied
    if platform.machine() in ("x86_64", "aarch64"):
        assert "seccomp" in applied


PROBE = """
import os, socket, sys
from worker.ingest.confine import confine
print(confine(memory_bytes=1 << 31, file_bytes=1 << 16))
secret, port, parent = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for path in (secret, f"/proc/{parent}/environ", "/etc/hostname"):
    try:
        open(path, "rb").read()
        print("read", path)
    except OSError as exc:
        print("denied", exc.errno)
try:
    open(os.path.join(os.path.dirname(secret), "new.txt"), "wb").close()
    print("wrote")
except OSError as exc:
    print("denied", exc.errno)
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    print("connected")
except OSError as exc:
    print("refused", exc.errno)
written = 0
try:
    while written < 1 << 18:
        written += os.write(2, b"x" * 4096)
    print("wrote", written)
except OSError as exc:
    print("file limit", exc.errno, written)
"""


@linux
@pytest.mark.skipif(_landlock_abi() < 1, reason="the kernel has no Landlock")
def test_a_confined_process_reads_no_file_and_reaches_no_network(tmp_path: Path) -> None:
    secret = tmp_path / "uploads" / "doc_1.pdf"
    secret.parent.mkdir()
    secret.write_bytes(b"%PDF-1.7 another tenant's upload")
    with socket.socket() as listener, open(tmp_path / "log", "wb") as log:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(secret), str(listener.getsockname()[1]),
             str(os.getpid())], env=child_env(), stdout=subprocess.PIPE, stderr=log,
            timeout=120, check=True)
    lines = done.stdout.decode().splitlines()
    assert "landlock-fs" in lines[0]
    assert lines[1:5] == ["denied 13"] * 4  # EACCES: the upload, our environ, /etc, a write
    assert lines[5].startswith("refused") and lines[6] == "file limit 27 65536"  # EFBIG
    assert not (tmp_path / "uploads" / "new.txt").exists()



REACH = """
import os, signal, socket, sys
from worker.ingest.confine import confine
print(confine(memory_bytes=1 << 31, file_bytes=1 << 16))
api, victim, path, abstract = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
for pid, sig in ((api, 0), (api, signal.SIGTERM), (victim, signal.SIGTERM), (0, 0), (-1, 0)):
    try:
        os.kill(pid, sig)
        print("signalled", pid)
    except OSError as exc:
        print("denied", exc.errno)
for address in (path, "\\0" + abstract):
    try:
        socket.socket(socket.AF_UNIX).connect(address)
        print("connected", address)
    except OSError as exc:
        print("denied", exc.errno)
os.kill(os.getpid(), 0)  # itself: still allowed
print("self")
"""


@linux
def test_a_confined_process_signals_and_connects_to_no_other_process(tmp_path: Path) -> None:
    """A compromised reader can neither signal the API process (nor a sibling, nor its
    process group) nor connect to a Unix socket of another process, by path or abstract
    name. Before Landlock's scopes and the seccomp filter, all seven succeeded (the victim
    ended with SIGTERM)."""
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the seccomp filter has no system call table for this machine")
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda sig, _frame: received.append(sig))
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    abstract = f"conduit-test-{os.getpid()}"
    try:
        with socket.socket(socket.AF_UNIX) as by_path, socket.socket(socket.AF_UNIX) as by_name, \
                open(tmp_path / "log", "wb") as log:
            by_path.bind(str(tmp_path / "api.sock"))
            by_path.listen()
            by_name.bind("\0" + abstract)
            by_name.listen()
            done = subprocess.run(
                [sys.executable, "-c", REACH, str(os.getpid()), str(victim.pid),
                 str(tmp_path / "api.sock"), abstract], env=child_env(),
                stdout=subprocess.PIPE, stderr=log, timeout=120, check=True)
        alive = victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
        signal.signal(signal.SIGTERM, previous)
    lines = done.stdout.decode().splitlines()
    assert lines[1:8] == ["denied 1"] * 7, (lines, (tmp_path / "log").read_text())  # EPERM
    assert lines[8] == "self"
    assert alive and received == []


@linux
def test_the_cpu_limit_ends_a_process_that_spins() -> None:
    spin = ("from worker.ingest.confine import cpu_limit\n"
            "cpu_limit(1)\nwhile True: pass\n")
    done = subprocess.run([sys.executable, "-c", spin], env=child_env(), timeout=120)
    assert done.returncode == -signal.SIGXCPU


def test_the_object_stream_bomb_is_refused_at_the_upload_check() -> None:
    data = objstm_bomb_pdf(300_000)  # 300 KB inflating to 300 MB, held twice by MuPDF
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(OpenMemoryLimitError) as info:
        check_upload(data, password=None, max_bytes=2**20, max_pages=10,
                     limits=ReaderLimits(memory_mb=400))
    assert info.value.http_status == 422
    assert "400 MiB memory limit" in info.value.message
    assert "CONDUIT_PAGE_MEMORY_MB" in info.value.message
    # before: the API process opened it itself, growing by 600 MB
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024


def test_the_object_stream_bomb_fails_the_ingest_open_naming_the_limit() -> None:
    opened = []
    with pytest.raises(OpenMemoryLimitError, match="CONDUIT_PAGE_MEMORY_MB"):
        for _ in iter_pages(objstm_bomb_pdf(300_000), dpi=30, max_pixels=10**6, ocr=False,
                            limits=ReaderLimits(memory_mb=400), on_open=opened.append):
            pass
    assert opened == []  # no page count was ever reported


def test_a_small_object_stream_file_opens_with_its_facts() -> None:
    reader_facts = []
    pages = list(iter_pages(objstm_bomb_pdf(1_000), dpi=30, max_pixels=10**6, ocr=False,
                            on_open=reader_facts.append))
    assert [p.number for p in pages] == [1]
    assert reader_facts[0].page_count == 1 and not reader_facts[0].truncated
