"""The house's layering, read from the code's imports (top-level and inside functions alike):

    service -> worker -> storage -> conduit_core

A layer imports only the layers below it; no product module imports the lab (`lab/`, its
own distribution) or the tests; conduit_core imports only torch, transformers, tokenizers,
PIL, numpy, safetensors and the standard library (no web, queue, storage or PDF code); the
product's modules import each other without circles; routers import no other router. The lab
may import the product but never the tests (the tests may import the lab), and its modules
import each other without circles, counting imports inside functions too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import conduit_core

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["conduit_core", "storage", "worker", "service"]  # bottom to top
OUTSIDE = {"lab", "tests"}
CORE_ALLOWED = {"torch", "transformers", "tokenizers", "PIL", "numpy", "safetensors",
                "conduit_core"}


def _modules(layer: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of one layer."""
    root = ROOT / layer
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """Absolute module names a file imports (`from a.b import c` gives a.b and a.b.c)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    # top level: the module's statements and those of its `if` blocks (a TYPE_CHECKING import
    # closes a loop for the type checker as much as any)
    nodes = ([*tree.body, *(n for s in tree.body if isinstance(s, ast.If)
                            for n in [*s.body, *s.orelse])]
             if top_level_only else ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


PRODUCT = {name: path for layer in LAYERS for name, path in _modules(layer).items()}
LAB = _modules("lab")


def _circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle among `edges` (module -> modules it imports), or None. A package's
    module importing the package itself (its face) is not a circle."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                loop = visit(nxt, [*path, nxt])
                if loop:
                    return loop
        state[node] = 2
        return None

    for name in sorted(edges):
        if name not in state:
            loop = visit(name, [name])
            if loop:
                return loop
    return None


def test_every_layer_imports_only_the_layers_below_it() -> None:
    assert len(PRODUCT) > 100
    for name, path in PRODUCT.items():
        rank = LAYERS.index(name.split(".")[0])
        for imported in _imports(path):
            top = imported.split(".")[0]
            assert top not in OUTSIDE, f"{name} imports {imported}: the product never imports " \
                "the lab or the tests"
            if top in LAYERS:
                assert LAYERS.index(top) <= rank, f"{name} imports {imported}: up a layer"


def test_conduit_core_imports_only_allowed_packages() -> None:
    for name, path in PRODUCT.items():
        if name.split(".")[0] != "conduit_core":
            continue
        bad = {m.split(".")[0] for m in _imports(path)} - CORE_ALLOWED
        bad = {m for m in bad if m not in sys.stdlib_module_names}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_no_import_circles_between_product_modules() -> None:
    """Module-level imports form no loop (a module's import of another runs at its import)."""
    edges = {name: {m for m in _imports(path, top_level_only=True) if m in PRODUCT} - {name}
             for name, path in PRODUCT.items()}
    loop = _circle(edges)
    assert loop is None, "import circle: " + " -> ".join(loop or [])


def test_the_lab_imports_no_tests() -> None:
    """Helpers the lab and the tests share live in the lab (or the product), never in tests."""
    assert len(LAB) > 50
    for name, path in LAB.items():
        bad = sorted(m for m in _imports(path) if m.split(".")[0] == "tests")
        assert not bad, f"{name} imports {bad}: the lab never imports the tests"


def test_no_import_circles_between_lab_modules() -> None:
    """No loop among the lab's modules, imports inside functions included (a lazy import
    that closes a loop is a loop all the same)."""
    edges = {name: {m for m in _imports(path) if m in LAB} - {name}
             for name, path in LAB.items()}
    loop = _circle(edges)
    assert loop is None, "import circle: " + " -> ".join(loop or [])


def test_routers_do_not_import_routers() -> None:
    routers = {n: p for n, p in PRODUCT.items() if n.startswith("service.routers.")}
    assert len(routers) >= 5
    for name, path in routers.items():
        others = {m for m in _imports(path) if m.startswith("service.routers")}
        assert not others, f"{name} imports {sorted(others)}: shared helpers live outside " \
            "the routers (service/access.py, service/answers.py)"


def test_public_api_reexports_resolve() -> None:
    assert sorted(conduit_core.__all__) == sorted(conduit_core._EXPORTS)
    for name in conduit_core.__all__:
        assert getattr(conduit_core, name).__name__ == name
