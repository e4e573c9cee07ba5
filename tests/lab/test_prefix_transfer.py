"""`conduit-lab bench prefix-transfer` runs end to end on a short prefix: each shape's bytes
per token come from its config (the builtin as loaded, the 7B shape), and its rows are
written as JSON and markdown."""

from __future__ import annotations

import json
from pathlib import Path

from lab.conversation.prefix_transfer import run, write


def test_prefix_transfer_rows(tmp_path: Path) -> None:
    doc = run(tokens=64, repeats=1, command="conduit-lab bench prefix-transfer --tokens 64")
    out = tmp_path / "prefix_transfer.json"
    write(doc, out)
    assert json.loads(out.read_text()) == doc
    rows = {r["model"]: r for r in doc["rows"]}
    # 2 (K, V) x 8 layers x 2 KV heads x 64 x 4 bytes; 2 x 28 x 4 x 128 x 2 bytes
    assert rows["builtin:small-qwen2-vl"]["bytes_per_token"] == 8192
    assert rows["7B shape"]["bytes_per_token"] == 57344
    for r in rows.values():
        assert r["redis_read_ms"] > 0 and r["redis_write_ms"] > 0 and r["copy_ms"] > 0
    assert "--tokens 64" in out.with_suffix(".md").read_text()
