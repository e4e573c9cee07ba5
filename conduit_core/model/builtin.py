"""Builtin tiny models (`builtin:<name>`), materialised once under a cache directory.

A builtin name resolves to a folder that `from_pretrained` loads like any checkpoint: the
model is built with a fixed seed (or, for `testbed-qwen2-vl`, from the committed trained
weights in `conduit_core/weights/`), saved with its locally built tokenizer and processor
under `cache_dir/<name>`, atomically (a temporary folder, then a rename), and never rebuilt
while that folder exists. `small-qwen2-vl` is the service's default; the `tiny-*` models
serve the tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from conduit_core.errors import UnsupportedModelError

BUILTIN_SCHEME = "builtin:"
# the builders live in builtin_models (imported on first build: it loads transformers)
BUILTIN_MODELS = ("small-qwen2-vl", "tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-llava-onevision",
                  "tiny-internvl", "testbed-qwen2-vl")
# visual tokens per page each builtin was built for (the loader's default cap)
BUILTIN_PAGE_TOKENS = ({name: 16 for name in BUILTIN_MODELS}
                       | {"small-qwen2-vl": 512, "testbed-qwen2-vl": 256})
_MARKER = "conduit_builtin.json"
_BUILD_VERSION = 3  # bump when a builder changes: old folders are rebuilt


def builtin_names() -> list[str]:
    """All builtin model names, with the scheme."""
    return [BUILTIN_SCHEME + n for n in BUILTIN_MODELS]


def is_builtin(name: str) -> bool:
    """Whether `name` uses the builtin scheme."""
    return name.startswith(BUILTIN_SCHEME)


def _source_tag(short: str) -> str:
    """What the build is made from beyond the code: the trained weights' digest, if any."""
    if short != "testbed-qwen2-vl":
        return ""
    from conduit_core.model.testbed_model import WEIGHTS

    return hashlib.sha256(WEIGHTS.read_bytes()).hexdigest() if WEIGHTS.is_file() else ""


def _folder_ok(folder: Path, short: str) -> bool:
    marker = folder / _MARKER
    if not marker.is_file():
        return False
    meta = json.loads(marker.read_text())
    return bool(meta.get("version") == _BUILD_VERSION
                and meta.get("source", "") == _source_tag(short))


def _build(short: str, builders: dict[str, Any]) -> tuple[Any, Any]:
    if short == "testbed-qwen2-vl":
        from conduit_core.model.testbed_model import build_testbed

        return build_testbed()
    return builders[short]()  # type: ignore[no-any-return]


def materialise_builtin(name: str, cache_dir: Path) -> Path:
    """Return the folder holding builtin `name`, building and saving it on first use."""
    short = name.removeprefix(BUILTIN_SCHEME)
    if short not in BUILTIN_MODELS:
        raise UnsupportedModelError(
            f"unknown builtin model {name!r}; available: {', '.join(builtin_names())}")
    folder = Path(cache_dir) / short
    if _folder_ok(folder, short):
        return folder
    from conduit_core.model.builtin_models import BUILDERS

    model, processor = _build(short, BUILDERS)
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{short}-", dir=cache_dir))
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"name": name, "version": _BUILD_VERSION,
                                               "source": _source_tag(short)}))
        if _folder_ok(folder, short):  # another process finished first: keep its copy (it
            return folder  # may be loading from it), which is identical
        if folder.exists():  # stale build version: replace it
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.rename(tmp, folder)
        except OSError:  # another process won the race; its copy is identical
            if not _folder_ok(folder, short):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
