"""Module docstrings say what a module is for and what it decides, not its signatures.

Every product module (conduit_core, storage, worker, service) opens with a docstring, and no
docstring carries a "Public API" block copying the module's names and signatures: the code is
the listing, and a copy drifts from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = sorted(path for layer in ("conduit_core", "storage", "worker", "service")
                 for path in (ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_docstring_states_a_contract(path: Path) -> None:
    doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path)))
    assert doc, f"{path.relative_to(ROOT)} has no module docstring"
    assert "Public API" not in doc, (
        f"{path.relative_to(ROOT)}: the module docstring copies its signatures under "
        "'Public API'; say what the module is for and what it decides instead")
