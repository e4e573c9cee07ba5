"""The packages a GPU loan's machine lacks: lab/gpu/device-wheels.txt names every package the
project needs at run time as carried (at the lock's version), held by the device image, or too
large to carry; lab/gpu/env.sh installs carried wheels for a Python that lacks them."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
LIST = ROOT / "lab" / "gpu" / "device-wheels.txt"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _groups() -> tuple[dict[str, str], set[str], set[str]]:
    """(carried name -> version, image names, too-large names) as the file lists them."""
    carried: dict[str, str] = {}
    groups: dict[str, set[str]] = {"image": set(), "too large": set()}
    current: set[str] | None = None
    for line in LIST.read_text().splitlines():
        if line.startswith("# image"):
            current = groups["image"]
        elif line.startswith("# too large"):
            current = groups["too large"]
        elif line.startswith("#   ") and current is not None:
            words = line[4:].split()
            if all(NAME.match(w) for w in words):
                current.update(words)
        elif line and not line.startswith("#"):
            name, version = line.split("==")
            carried[_norm(name)] = version
    return carried, groups["image"], groups["too large"]


def _runtime_closure() -> dict[str, str]:
    """Every distribution the project's two packages need at run time, with its version."""
    seen: dict[str, str] = {}

    def walk(name: str) -> None:
        key = _norm(name)
        if key in seen:
            return
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            return
        seen[key] = dist.version
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                walk(req.name)

    walk("conduit")
    walk("conduit-lab")
    return {k: v for k, v in seen.items() if k not in ("conduit", "conduit-lab")}


def test_every_runtime_package_is_carried_on_the_image_or_named_too_large():
    carried, image, large = _groups()
    assert "transformers" in carried and "torch" in image and "pymupdf" in large
    assert not (set(carried) & image) and not (set(carried) & large) and not (image & large)
    closure = _runtime_closure()
    missing = sorted(set(closure) - set(carried) - image - large)
    assert not missing, f"add these to lab/gpu/device-wheels.txt: {missing}"
    stale = {k: (v, closure[k]) for k, v in carried.items() if closure.get(k) != v}
    assert not stale, f"carried pins differ from the lock (listed, installed): {stale}"


def _wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel of a module `conduit_wheel_probe`."""
    path = folder / "conduit_wheel_probe-1.0-py3-none-any.whl"
    info = "conduit_wheel_probe-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("conduit_wheel_probe.py", "CARRIED = True\n")
        zf.writestr(f"{info}/METADATA",
                    "Metadata-Version: 2.1\nName: conduit-wheel-probe\nVersion: 1.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def _sourced(python: Path, wheels: Path, site: Path) -> subprocess.CompletedProcess[str]:
    script = ('source lab/gpu/env.sh && "$PY" -c '
              '"import conduit_wheel_probe as m; print(m.CARRIED)"')
    env = {**os.environ, "PYTHON": str(python), "CONDUIT_GPU_WHEELS": str(wheels),
           "CONDUIT_GPU_SITE": str(site)}
    env.pop("PYTHONPATH", None)
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_env_installs_carried_wheels_for_a_python_that_lacks_the_projects_packages(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    bare = tmp_path / "bare"  # a Python with pip and nothing of the project's, like the image's
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True, timeout=300)
    site = tmp_path / "site"
    out = _sourced(bare / "bin" / "python", wheels, site)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    assert list(site.glob(".installed-*"))  # installed once: a second source reuses it
    again = _sourced(bare / "bin" / "python", wheels, site)
    assert again.returncode == 0 and again.stdout.strip() == "True"
    ours = _sourced(Path(sys.executable), wheels, tmp_path / "untouched")
    assert ours.returncode != 0  # the project's own Python has its packages: nothing installed
    assert not (tmp_path / "untouched").exists()
