"""`ReuseRuntime`'s public methods are the product's: each is called from worker/ or service/.

A method only the lab or the tests call belongs with them (`lab/answering.py` builds whole
answers, full prefills and warm labels on the product surface), and the lab watches the
runtime through its observer (`conduit_core.pass_observer`), so that nothing outside the
product fixes the runtime's method boundaries. The callers are read from the product's source
(ast): a call `X.method(...)` whose receiver `X` names the runtime (`rt`, or any expression
naming `runtime`, as `ctx.runtime`, `self._runtime` and `self._runtime_fn()`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conduit_core.runtime import ReuseRuntime

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_CALLERS = ("worker", "service")
RUNTIME_NAME = re.compile(r"\brt\b|runtime")  # a receiver that names the runtime


def _public_methods() -> set[str]:
    tree = ast.parse((ROOT / "conduit_core" / "runtime.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ReuseRuntime"]
    return {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and not n.name.startswith("_")}


def _product_calls() -> dict[str, set[str]]:
    """Method name -> the product files that call it on the runtime."""
    calls: dict[str, set[str]] = {}
    for folder in PRODUCT_CALLERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and RUNTIME_NAME.search(ast.unparse(node.func.value)):
                    calls.setdefault(node.func.attr, set()).add(
                        str(path.relative_to(ROOT)))
    return calls


def test_the_class_read_is_the_class_imported() -> None:
    """The ast reading above sees the methods Python sees."""
    assert _public_methods() == {name for name, value in vars(ReuseRuntime).items()
                                 if callable(value) and not name.startswith("_")}


def test_every_public_method_of_the_runtime_has_a_product_caller() -> None:
    calls = _product_calls()
    surface = {name: sorted(calls.get(name, ())) for name in sorted(_public_methods())}
    unused = [name for name, callers in surface.items() if not callers]
    assert not unused, f"public methods of ReuseRuntime no product code calls: {unused} " \
        f"(move them to lab/answering.py or a test helper); callers: {surface}"
