"""The packages a GPU loan's machine lacks: lab/gpu/device-wheels.txt names every package the
project needs at run time as carried (at the lock's version), held by the device image, or too
large to carry; lab/gpu/env.sh installs carried wheels for a Python that lacks them."""

from __future__ import annotations

import hashlib
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
LARGE = ROOT / "lab" / "gpu" / "device-wheels-large.txt"
LOCK = ROOT / "constraints.txt"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    """name -> version of a requirements file's `name==version` lines."""
    pins = (line.split("==") for line in path.read_text().splitlines()
            if line and not line.startswith("#"))
    return {_norm(name): version for name, version in pins}


def _groups() -> tuple[dict[str, str], set[str], dict[str, str]]:
    """(carried name -> version, image names, too-large name -> version) as the files list
    them."""
    image: set[str] = set()
    listing = False
    for line in LIST.read_text().splitlines():
        if line.startswith("#   "):
            if listing:
                image.update(w for w in line[4:].split() if NAME.match(w))
        elif line.startswith("#"):
            listing = line.startswith("# image")
    return _pins(LIST), image, _pins(LARGE)


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
    assert not (set(carried) & image) and not (set(carried) & set(large))
    assert not (image & set(large))
    closure = _runtime_closure()
    missing = sorted(set(closure) - set(carried) - image - set(large))
    assert not missing, f"add these to lab/gpu/device-wheels.txt: {missing}"
    lock = _pins(LOCK)
    pinned = {**carried, **large}
    stale = {k: (v, lock.get(k)) for k, v in pinned.items() if lock.get(k) != v}
    assert not stale, f"carried pins differ from the lock (listed, locked): {stale}"


def test_the_install_follows_the_lock():
    """`make install` installs every runtime package at the lock's version (constraints.txt),
    so a clean clone runs what the lock names, not whatever the index holds that day."""
    lock = _pins(LOCK)
    closure = _runtime_closure()
    unlocked = sorted(set(closure) - set(lock))
    assert not unlocked, f"runtime packages missing from constraints.txt (make lock): {unlocked}"
    drift = {k: (lock[k], v) for k, v in closure.items() if v.split("+")[0] != lock[k]}
    assert not drift, f"installed versions differ from the lock (locked, installed): {drift}"


def _wheel(folder: Path, module: str = "conduit_wheel_probe") -> Path:
    """A minimal pure-Python wheel of a module `module`."""
    path = folder / f"{module}-1.0-py3-none-any.whl"
    info = f"{module}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{module}.py", "CARRIED = True\n")
        zf.writestr(f"{info}/METADATA",
                    f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def _sourced(python: Path, wheels: Path, site: Path, large: Path | None = None,
             module: str = "conduit_wheel_probe") -> subprocess.CompletedProcess[str]:
    script = f'source lab/gpu/env.sh && "$PY" -c "import {module} as m; print(m.CARRIED)"'
    env = {**os.environ, "PYTHON": str(python), "CONDUIT_GPU_WHEELS": str(wheels),
           "CONDUIT_GPU_SITE": str(site), "CONDUIT_GPU_LARGE": str(large or site / "none")}
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


def _parts(folder: Path, wheel: Path, n: int) -> None:
    """`wheel` in a tar cut into `n` parts laid out as `wheels.sh --large` lays them out."""
    folder.mkdir(parents=True)
    tar = folder / "whole.tar"
    subprocess.run(["tar", "-cf", str(tar), "-C", str(wheel.parent), wheel.name], check=True)
    data = tar.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    step = -(-len(data) // n)
    for k in range(n):
        part = folder / f"large-{k + 1}"
        part.mkdir()
        (part / "part").write_bytes(data[k * step:(k + 1) * step])
        (part / "whole").write_text(f"{digest} {n}\n")
    tar.unlink()


def test_env_installs_the_large_wheels_once_every_part_is_carried(tmp_path):
    made = tmp_path / "made"
    made.mkdir()
    large = tmp_path / "carry"
    _parts(large, _wheel(made, "conduit_large_probe"), 3)
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True, timeout=300)
    python, none, site = bare / "bin" / "python", tmp_path / "no-wheels", tmp_path / "site"
    (large / "large-2" / "part").rename(tmp_path / "held-back")
    out = _sourced(python, none, site, large, "conduit_large_probe")
    assert out.returncode != 0 and "large-2 of 3 not carried yet" in out.stderr
    good = (tmp_path / "held-back").read_bytes()
    (large / "large-2" / "part").write_bytes(b"x" + good[1:])  # a part that is not the one
    out = _sourced(python, none, site, large, "conduit_large_probe")
    assert out.returncode != 0 and "do not make the whole" in out.stderr
    (large / "large-2" / "part").write_bytes(good)
    out = _sourced(python, none, site, large, "conduit_large_probe")
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def test_testbed_pack_brings_back_each_seeds_last_finished_weights(tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    for run, finished in [("s0", True), ("s0-stage3", True), ("s0-stage4", False),
                          ("s1", True), ("s2", False)]:
        (results / run).mkdir(parents=True)
        (results / run / "history.jsonl").write_text('{"step": 1}\n')
        (results / run / "checkpoint.safetensors").write_bytes(b"optimizer state")
        if finished:
            (results / run / "model.safetensors").write_bytes(run.encode())
    subprocess.run(["bash", "lab/gpu/testbed_pack.sh", str(results), str(out)], cwd=ROOT,
                   check=True, capture_output=True, timeout=60)
    assert sorted(p.name for p in out.iterdir()) == [
        "s0-stage3.safetensors", "s1-stage2.safetensors", "testbed_runs.tgz"]
    assert (out / "s0-stage3.safetensors").read_bytes() == b"s0-stage3"
    listing = subprocess.run(["tar", "-tzf", str(out / "testbed_runs.tgz")], check=True,
                             capture_output=True, text=True).stdout
    assert "./s2/history.jsonl" in listing and ".safetensors" not in listing
