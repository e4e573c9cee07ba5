"""conduit_core imports only torch, transformers, tokenizers, PIL, numpy, safetensors and the
standard library: never storage/worker/service, web, queue or PDF code."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import conduit_core

ALLOWED = {"torch", "transformers", "tokenizers", "PIL", "numpy", "safetensors", "conduit_core"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_conduit_core_imports_only_allowed_packages() -> None:
    root = Path(conduit_core.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 10
    for path in files:
        bad = {m for m in _imports(path)
               if m not in ALLOWED and m not in sys.stdlib_module_names}
        assert not bad, f"{path.relative_to(root)} imports {sorted(bad)}"


def test_public_api_reexports_resolve() -> None:
    assert sorted(conduit_core.__all__) == sorted(conduit_core._EXPORTS)
    for name in conduit_core.__all__:
        assert getattr(conduit_core, name).__name__ == name
