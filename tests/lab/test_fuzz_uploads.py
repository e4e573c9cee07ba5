"""A small run of the upload fuzz (lab/fuzz/uploads.py, issue 30): 20 mutants of the test
builders' PDFs through `check_upload` and the readers: no crash of the API process, no stuck
job, no unexpected error, the API process's memory flat, and a crashing driver is counted;
and 8 mutants through HTTP to a real embedded service (lab/fuzz/uploads_http.py): every
upload a 202 or a readable 4xx, every document settled, every document and the collection's
listing 200 with valid UTF-8."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx

from lab.fuzz.mutants import MUTATIONS, builder_sources, mutate
from lab.fuzz.uploads import main
from lab.fuzz.uploads_http import passed, reply_problem


def test_mutations_are_deterministic_and_change_the_file() -> None:
    name, data = builder_sources()[0]
    first = [mutate(random.Random(seed), data, data) for seed in range(40)]
    again = [mutate(random.Random(seed), data, data) for seed in range(40)]
    assert first == again
    assert {kind for kind, _ in first} == set(MUTATIONS)
    assert sum(out != data for _, out in first) >= 38


def test_twenty_mutants_pass_the_upload_path_without_a_crash(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    rc = main(["--count", "20", "--seed", "7", "--devset-files", "0", "--memory-mb", "1024",
               "--page-seconds", "60", "--deadline", "120", "--json", str(out)])
    figures = json.loads(out.read_text())
    assert rc == 0
    assert figures["files_tried"] == 20 and len(figures["rows"]) == 20
    assert figures["api_process_crashes"] == 0 and figures["stuck_jobs"] == 0
    assert figures["unexpected_errors"] == 0
    assert figures["accepted"] + sum(figures["refused"].values()) == 20
    assert all(key.startswith(("400 ", "413 ", "422 ")) for key in figures["refused"])
    assert figures["api_peak_rss_mib"] - figures["api_baseline_rss_mib"] < 100


def test_a_driver_that_dies_or_hangs_is_counted_and_the_run_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    rc = main(["--count", "4", "--seed", "7", "--devset-files", "0", "--abort-at", "1",
               "--hang-at", "2", "--stuck-after", "5", "--json", str(out)])
    figures = json.loads(out.read_text())
    assert rc == 1
    assert figures["api_process_crashes"] == 1 and figures["stuck_jobs"] == 1
    assert [r["outcome"] for r in figures["rows"]][1:3] == ["crash", "stuck"]
    assert figures["files_tried"] == 4 and figures["rows"][3]["i"] == 3


def test_the_http_checks_catch_a_500_an_unreadable_body_and_a_bare_4xx() -> None:
    def reply(status: int, content: bytes) -> httpx.Response:
        return httpx.Response(status, content=content,
                              headers={"Content-Type": "application/json"})

    assert reply_problem(reply(200, b'[{"reason": "unknown keyword: \'0\\\\xc6T\'"}]')) is None
    assert reply_problem(reply(422, b'{"detail": "The PDF has no pages."}'), ok=(202,)) is None
    assert reply_problem(reply(500, b'{"detail": "Internal Server Error"}')) is not None
    assert reply_problem(reply(200, b'[{"reason": "0\\udcc6T"}]')) is not None  # lone surrogate
    assert reply_problem(reply(200, b'{"reason": "0\xc6T"}')) is not None  # not UTF-8
    assert reply_problem(reply(200, b"Internal Server Error")) is not None  # not JSON
    assert reply_problem(reply(422, b'{"detail": ""}'), ok=(202,)) is not None  # no message
    clean = {"api_process_crashes": 0, "stuck_jobs": 0, "server_errors": 0, "bad_replies": 0,
             "poll_errors": 0, "read_back_problems": 0, "listing_status": 200}
    assert passed(clean)
    assert not passed({**clean, "listing_status": 500})
    assert not passed({**clean, "stuck_jobs": 1})


def test_eight_mutants_through_http_leave_every_document_and_the_listing_readable(
        tmp_path: Path) -> None:
    out = tmp_path / "fuzz_http.json"
    rc = main(["--http", "--count", "8", "--seed", "7", "--devset-files", "0",
               "--stuck-after", "300", "--json", str(out)])
    figures = json.loads(out.read_text())
    assert figures["files_tried"] == 8 and len(figures["rows"]) == 8
    assert all(r["outcome"] in ("accepted", "refused") for r in figures["rows"]), figures["rows"]
    assert set(figures["upload_statuses"]) <= {"202", "400", "413", "422"}
    assert figures["accepted"] >= 1  # something reaches the ingest, the document and listing
    assert figures["ingest_ready"] + figures["ingest_failed"] == figures["accepted"]
    assert figures["api_process_crashes"] == figures["stuck_jobs"] == 0
    assert figures["server_errors"] == figures["bad_replies"] == figures["poll_errors"] == 0
    assert figures["listing_status"] == 200 and figures["read_back_problems"] == 0
    assert figures["read_back_gets"] >= 2 * figures["accepted"] + 1
    assert figures["api_peak_rss_mib"] >= figures["api_start_rss_mib"] > 0
    assert rc == 0
