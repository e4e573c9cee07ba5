"""The lab is its own distribution: lab/pyproject.toml lists every package under lab/, and its
console script is the lab's command line."""

from __future__ import annotations

import tomllib
from pathlib import Path

import lab

PYPROJECT = tomllib.loads((lab.LAB / "pyproject.toml").read_text())


def test_every_lab_package_is_listed() -> None:
    found = {".".join(("lab", *p.parent.relative_to(lab.LAB).parts))
             for p in lab.LAB.rglob("__init__.py")}
    assert set(PYPROJECT["tool"]["setuptools"]["packages"]) == found


def test_the_console_script_and_the_results_folders() -> None:
    assert PYPROJECT["project"]["scripts"] == {"conduit-lab": "lab.cli:main"}
    assert lab.results("ttft") == lab.LAB / "ttft" / "results"
    for notes in lab.LAB.glob("*/NOTES.md"):  # one notes file per subject, beside its code
        assert (notes.parent / "__init__.py").is_file(), notes
    assert Path(lab.__file__).parent == lab.LAB
