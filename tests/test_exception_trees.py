"""One exception tree per layer: every exception class a product module defines derives from
its layer's root (ConduitCoreError, StorageError, WorkerError; the service defines none), but
for the ingest readers' private pipe signals, which never leave their module pair; and no two
exception classes share a name."""

from __future__ import annotations

import ast
import importlib

from conduit_core.errors import ConduitCoreError
from storage.errors import StorageError
from tests.test_layering import PRODUCT
from worker.errors import WorkerError

ROOTS: dict[str, type[Exception]] = {"conduit_core": ConduitCoreError, "storage": StorageError,
                                      "worker": WorkerError}
PRIVATE = {"worker.ingest.frames.ReaderGone", "worker.ingest.frames.ReaderTimeout",
           "worker.ingest.sandbox._Died"}


def _exception_classes() -> list[tuple[str, type]]:
    """(module.Class, class) for every class whose base names look like exceptions."""
    found = []
    for name, path in PRODUCT.items():
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception", "Mismatch"))
                    for b in node.bases):
                found.append((f"{name}.{node.name}",
                              getattr(importlib.import_module(name), node.name)))
    return found


def test_every_exception_derives_from_its_layers_root() -> None:
    classes = _exception_classes()
    assert len(classes) > 30
    for qualified, cls in classes:
        if qualified in PRIVATE:
            continue
        layer = qualified.split(".")[0]
        assert layer in ROOTS, f"{qualified}: the {layer} layer defines no exceptions"
        assert issubclass(cls, ROOTS[layer]), f"{qualified} is outside {ROOTS[layer].__name__}"


def test_no_two_exceptions_share_a_name() -> None:
    names = [qualified.rsplit(".", 1)[1] for qualified, _ in _exception_classes()]
    assert sorted({n for n in names if names.count(n) > 1}) == []
