"""Finding 11's small items that need no server: the keys file is validated with a clear
message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.auth import KeyRing, read_keys_file, tenant_of_key
from worker.settings import Settings


def test_keys_file_maps_keys_to_tenants_and_keeps_the_list_form(tmp_path: Path) -> None:
    mapping = tmp_path / "keys.json"
    mapping.write_text(json.dumps({"k1": "acme", "k2": "acme"}))
    ring = KeyRing.from_settings(Settings(api_keys=["legacy"], api_keys_file=mapping))
    assert ring.tenant("k1") == ring.tenant("k2") == "acme"
    assert ring.tenant("legacy") == tenant_of_key("legacy")
    assert ring.tenant("nope") is None
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(["a", "b"]))
    assert read_keys_file(listed) == {"a": tenant_of_key("a"), "b": tenant_of_key("b")}


@pytest.mark.parametrize("content", ['{"k": "bad tenant!"}', '{"k": 3}', "[1]", "not json"])
def test_a_malformed_keys_file_is_refused_with_its_path(tmp_path: Path, content: str) -> None:
    path = tmp_path / "keys.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="keys.json"):
        read_keys_file(path)
