"""A small run of the upload fuzz (lab/fuzz/uploads.py, issue 30): 20 mutants of the test
builders' PDFs through `check_upload` and the readers: no crash of the API process, no stuck
job, no unexpected error, the API process's memory flat, and a crashing driver is counted."""

from __future__ import annotations

import json
import random
from pathlib import Path

from lab.fuzz.uploads import MUTATIONS, builder_sources, main, mutate


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
