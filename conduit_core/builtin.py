"""Builtin tiny models (`builtin:<name>`), materialised once under a cache directory.

Public API:
  BUILTIN_SCHEME = "builtin:";  BUILTIN_MODELS: the builtin names without the scheme
  builtin_names() -> list[str]                 e.g. ["builtin:tiny-qwen2-vl", ...]
  is_builtin(name) -> bool
  materialise_builtin(name, cache_dir) -> Path
      Build the model (fixed seed) and its locally built tokenizer/processor, save them with
      `save_pretrained` under `cache_dir/<name>` (atomically: temp folder, then rename) and
      return that folder; later calls return the existing folder without rebuilding.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from conduit_core.errors import UnsupportedModelError

BUILTIN_SCHEME = "builtin:"
# the builders live in builtin_models (imported on first build: it loads transformers)
BUILTIN_MODELS = ("tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-llava-onevision", "tiny-internvl")
_MARKER = "conduit_builtin.json"
_BUILD_VERSION = 2  # bump when a builder changes: old folders are rebuilt


def builtin_names() -> list[str]:
    """All builtin model names, with the scheme."""
    return [BUILTIN_SCHEME + n for n in BUILTIN_MODELS]


def is_builtin(name: str) -> bool:
    """Whether `name` uses the builtin scheme."""
    return name.startswith(BUILTIN_SCHEME)


def _folder_ok(folder: Path) -> bool:
    marker = folder / _MARKER
    if not marker.is_file():
        return False
    return bool(json.loads(marker.read_text()).get("version") == _BUILD_VERSION)


def materialise_builtin(name: str, cache_dir: Path) -> Path:
    """Return the folder holding builtin `name`, building and saving it on first use."""
    short = name.removeprefix(BUILTIN_SCHEME)
    if short not in BUILTIN_MODELS:
        raise UnsupportedModelError(
            f"unknown builtin model {name!r}; available: {', '.join(builtin_names())}")
    folder = Path(cache_dir) / short
    if _folder_ok(folder):
        return folder
    from conduit_core.builtin_models import BUILDERS

    model, processor = BUILDERS[short]()
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{short}-", dir=cache_dir))
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"name": name, "version": _BUILD_VERSION}))
        if folder.exists():  # stale build version: replace it
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.rename(tmp, folder)
        except OSError:  # another process won the race; its copy is identical
            if not _folder_ok(folder):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
