"""Fair sharing between tenants over real HTTP (issue 60, point 3), on `conduit serve`
processes with two API keys:

- four object-stream bombs uploaded at once never hold more reader memory together than
  `CONDUIT_READER_MEMORY_MB` (the readers' summed RSS sampled from /proc while they run); the
  uploads beyond it get 503 with Retry-After, and the service stays healthy;
- tenant A's three slow (fill-bomb) documents delay tenant B's one-page document by at most
  the one that is running, and A's upload beyond its queued-documents cap gets 429;
- tenant A's streams beyond its answer cap get 429, and B's short question gets its first
  token and its answer while A's long streams still run;
- /readyz answers promptly while every request thread waits on an answer (open mode).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lab.ingest.bad_pdfs import content_bomb_pdf
from lab.ingest.builders import text_pages_pdf
from lab.ingest.objstm_bomb import objstm_bomb_pdf
from tests.faults.conftest import start_serve

A, B = "tenant-a-key", "tenant-b-key"
READER_MB = 2048  # two readers at a time, each under a 1024 MiB address-space limit
ENV = {"CONDUIT_API_KEYS": json.dumps([A, B]), "CONDUIT_MODEL": "builtin:tiny-qwen2-vl",
       "CONDUIT_OCR": "false", "CONDUIT_PAGE_MEMORY_MB": str(READER_MB // 2),
       "CONDUIT_READER_MEMORY_MB": str(READER_MB), "CONDUIT_PAGE_TIMEOUT_S": "5",
       "CONDUIT_MAX_QUEUED_DOCUMENTS_PER_TENANT": "3", "CONDUIT_MAX_ACTIVE_ANSWERS": "4",
       "CONDUIT_MAX_ANSWERS_PER_TENANT": "2"}
SETTLED = ("ready", "failed")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    home = tmp_path_factory.mktemp("fair")
    url, proc = start_serve(home, ENV)
    yield url, proc.pid
    proc.terminate()
    proc.wait(timeout=30)


def _client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {key}"})


def _collection(client: httpx.Client, name: str) -> str:
    r = client.post("/v1/collections", json={"name": name})
    assert r.status_code in (200, 201), r.text
    return str(r.json()["collection_id"])


def _upload(client: httpx.Client, col: str, name: str, data: bytes) -> httpx.Response:
    return client.post(f"/v1/collections/{col}/documents",
                       files={"file": (name, data, "application/pdf")})


def _settle(client: httpx.Client, doc_ids: list[str], timeout: float = 300) -> dict[str, float]:
    """When each document was first seen ready or failed (monotonic seconds)."""
    return _settle_all([(client, d) for d in doc_ids], timeout)


def _settle_all(docs: list[tuple[httpx.Client, str]], timeout: float = 300
                ) -> dict[str, float]:
    """When each (owner's client, document) was first seen ready or failed, all polled
    together (monotonic seconds)."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(docs) and time.monotonic() < deadline:
        for client, d in docs:
            if d not in seen and client.get(f"/v1/documents/{d}").json()["status"] in SETTLED:
                seen[d] = time.monotonic()
        time.sleep(0.1)
    left = {d for _, d in docs} - set(seen)
    assert not left, f"not settled in {timeout} s: {left}"
    return seen


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process now."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        out[int(stat.parent.name)] = (int(fields[1]), cmd)
    return out


def _readers_rss_mib(server: int) -> float:
    """The summed resident memory of the server's page readers: its descendants but the
    fork server (a template that never opens a document)."""
    procs = _processes()
    found, todo = [], [server]
    while todo:
        parent = todo.pop()
        for pid, (ppid, cmd) in procs.items():
            if ppid == parent:
                todo.append(pid)
                if not (parent == server and "fork_server" in cmd):  # its forks share
                    found.append(pid)  # its command line
    total = 0
    for pid in found:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:  # ended meanwhile
            continue
    return total / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_readers_stay_within_the_reader_memory_budget(served: tuple[str, int]) -> None:
    url, pid = served
    bomb = objstm_bomb_pdf(400_000)  # its object stream inflates to about 400 MB at open
    clients = [_client(url, A), _client(url, B)]
    cols = [_collection(c, "bombs") for c in clients]
    replies: list[httpx.Response] = []
    peak = 0.0
    running = threading.Event()
    running.set()

    def sample() -> None:
        nonlocal peak
        while running.is_set():
            peak = max(peak, _readers_rss_mib(pid))
            time.sleep(0.01)

    def upload(i: int) -> None:
        replies.append(_upload(clients[i % 2], cols[i % 2], f"bomb{i}.pdf", bomb))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        uploads = [threading.Thread(target=upload, args=(i,)) for i in range(4)]
        for t in uploads:
            t.start()
        for t in uploads:
            t.join(300)
        accepted = [r.json()["document_id"] for r in replies if r.status_code == 202]
        for i, c in enumerate(clients):  # the accepted ones ingest (their readers wait too)
            mine = [d["document_id"] for d in c.get(f"/v1/collections/{cols[i]}/documents").json()]
            _settle(c, mine)
    finally:
        running.clear()
        sampler.join()
    codes = sorted(r.status_code for r in replies)
    print(f"upload replies {codes}; readers' peak summed RSS {peak:.0f} MiB; "
          f"accepted {len(accepted)}")
    # before the fix: the four readers ran at once (about 3 GB together), every upload 202
    assert peak <= READER_MB, peak
    assert peak > 100  # the sampler saw the readers at work
    busy = [r for r in replies if r.status_code == 503]
    assert busy and set(codes) <= {202, 503}, codes
    for r in busy:
        assert r.headers["Retry-After"] and "CONDUIT_READER_MEMORY_MB" in r.json()["detail"]
    assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    assert httpx.get(url + "/readyz", timeout=5).status_code == 200


def test_one_tenants_slow_documents_do_not_hold_up_anothers(served: tuple[str, int]) -> None:
    url, _ = served
    a, b = _client(url, A), _client(url, B)
    col_a, col_b = _collection(a, "slow"), _collection(b, "quick")
    fill = content_bomb_pdf(1, kind="fills", pages_before=0)  # a page of ~20 s, stopped at 5
    slow = []
    for i in range(3):
        r = _upload(a, col_a, f"fill{i}.pdf", fill)
        assert r.status_code == 202, r.text
        slow.append(r.json()["document_id"])
    over = _upload(a, col_a, "fill3.pdf", fill)  # a fourth while three are queued or running
    assert over.status_code == 429, over.text
    assert over.headers["Retry-After"]
    assert "CONDUIT_MAX_QUEUED_DOCUMENTS_PER_TENANT" in over.json()["detail"]
    r = _upload(b, col_b, "quick.pdf", text_pages_pdf(["The ferry leaves at nine."]))
    assert r.status_code == 202, r.text  # B's cap is its own
    quick = r.json()["document_id"]
    done = _settle_all([(b, quick)] + [(a, d) for d in slow])
    done_b = done.pop(quick)
    done_a = done
    assert b.get(f"/v1/documents/{quick}").json()["status"] == "ready"
    before_b = sum(t < done_b for t in done_a.values())
    print(f"A's documents settled before B's: {before_b} of 3")
    # before the fix (one FIFO): all three of A's first
    assert before_b <= 1


def _stream(client: httpx.Client, body: dict[str, object], first: threading.Event,
            out: dict[str, object]) -> None:
    """POST a streamed question; `out` gets its status, when its first token and its end
    arrived (monotonic seconds)."""
    with client.stream("POST", "/v1/query/stream", json=body) as r:
        out["status"] = r.status_code
        if r.status_code != 200:
            r.read()
            out["detail"] = r.json()["detail"]
            out["retry_after"] = r.headers.get("Retry-After")
            first.set()
            return
        for line in r.iter_lines():
            if line.startswith("event: token") and "first" not in out:
                out["first"] = time.monotonic()
                first.set()
            elif line.startswith("event: done") or line.startswith("event: error"):
                out["end"] = time.monotonic()
                out["event"] = line
        first.set()


def test_a_tenants_streams_beyond_its_cap_get_429_and_never_hold_up_another(
        served: tuple[str, int]) -> None:
    url, _ = served
    a, b = _client(url, A), _client(url, B)
    col_a, col_b = _collection(a, "talk"), _collection(b, "talk")
    docs = {}
    for c, col in ((a, col_a), (b, col_b)):
        r = _upload(c, col, "ops.pdf", text_pages_pdf(["Pump maintenance: the seals are "
                                                       "replaced every spring."]))
        assert r.status_code == 202, r.text
        docs[col] = r.json()["document_id"]
    _settle(a, [docs[col_a]])
    _settle(b, [docs[col_b]])
    long_body = {"collection_id": col_a, "question": "What is on the page?", "top_k": 1,
                 "max_new_tokens": 2048}
    streams: list[dict[str, object]] = [{} for _ in range(6)]
    started = [threading.Event() for _ in streams]
    threads = [threading.Thread(target=_stream, args=(_client(url, A), long_body, started[i],
                                                      streams[i]), daemon=True)
               for i in range(6)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(120)
    accepted = [s for s in streams if s["status"] == 200]
    refused = [s for s in streams if s["status"] == 429]
    # before the fix: all six streamed (four active, two queued; B's question queued behind)
    assert len(accepted) == 2 and len(refused) == 4, [s.get("status") for s in streams]
    for s in refused:
        assert s["retry_after"] and "CONDUIT_MAX_ANSWERS_PER_TENANT" in str(s["detail"])
    mine: dict[str, object] = {}
    _stream(b, {"collection_id": col_b, "question": "When are the seals replaced?",
                "top_k": 1, "max_new_tokens": 4}, threading.Event(), mine)
    assert mine["status"] == 200 and mine["event"] == "event: done", mine
    b_end = float(mine["end"])  # type: ignore[arg-type]
    still_running = [s for s in accepted if float(s.get("end", 1e18)) > b_end]  # type: ignore[arg-type]
    print(f"B answered while {len(still_running)} of A's streams ran")
    assert len(still_running) == 2
    for t in threads:
        t.join(300)
    assert all(s.get("event") == "event: done" for s in accepted), accepted


def test_readiness_answers_while_every_request_thread_waits(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("probes")
    # open mode (one tenant, no answer cap); one answer at a time, so the streams queue
    url, proc = start_serve(home, {"CONDUIT_MODEL": "builtin:tiny-qwen2-vl",
                                   "CONDUIT_OCR": "false", "CONDUIT_MAX_ACTIVE_ANSWERS": "1"})
    try:
        client = httpx.Client(base_url=url, timeout=300)
        col = _collection(client, "probes")
        r = _upload(client, col, "ops.pdf", text_pages_pdf(["The ferry leaves at nine."]))
        _settle(client, [r.json()["document_id"]])
        body = {"collection_id": col, "question": "What is on the page?", "top_k": 1,
                "max_new_tokens": 2048}
        # each stream holds a request thread while its answer waits or runs: 48 hold all 40
        stop = threading.Event()

        def hold() -> None:
            with httpx.Client(base_url=url, timeout=300) as c, \
                    c.stream("POST", "/v1/query/stream", json=body):
                stop.wait(120)
        holders = [threading.Thread(target=hold, daemon=True) for _ in range(48)]
        for t in holders:
            t.start()
        time.sleep(3)
        start = time.monotonic()
        ready = httpx.get(url + "/readyz", timeout=60)
        took = time.monotonic() - start
        health = httpx.get(url + "/healthz", timeout=60)
        print(f"/readyz answered in {took:.3f} s with the thread pool held")
        stop.set()
        for t in holders:
            t.join(60)
        assert ready.status_code == 200 and health.status_code == 200
        # before the fix: /readyz waited for a request thread (a stream's end, seconds)
        assert took < 2.0, took
    finally:
        proc.terminate()
        proc.wait(timeout=30)
