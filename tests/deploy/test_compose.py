"""docker-compose.yml, its env file and GPU override, and deploy/Dockerfile agree with the code:
real `conduit` subcommands, real Settings fields, one shared volume at CONDUIT_HOME, and an image
that contains every package pyproject installs."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from service.cli import _parser
from tests.deploy.chart import ROOT, settings_field, settings_of

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
_VAR = re.compile(r"\$\{(\w+)(?:(:?-)([^}]*))?\}")


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR-default}` and `${VAR:-default}` substitution."""
    def sub(m: re.Match[str]) -> str:
        name, op, default = m[1], m[2], m[3] or ""
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        return env.get(name, "")
    return _VAR.sub(sub, text)


def _interpolated(node: Any, env: dict[str, str]) -> Any:
    """Compose interpolates string values after parsing: `${X:-}` is "", never null."""
    if isinstance(node, dict):
        return {k: _interpolated(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolated(v, env) for v in node]
    return _interpolate(node, env) if isinstance(node, str) else node


def _compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = _interpolated(yaml.safe_load(COMPOSE.read_text()), env or {})
    return data


def _env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for op, rest in _dockerfile():
        if op == "ENV":
            env.update(p.split("=", 1) for p in shlex.split(rest))
    return env


def test_commands_are_real_conduit_subcommands() -> None:
    services = _compose()["services"]
    expected = {"api": "_serve", "worker": "_worker"}
    for name, func in expected.items():
        command = services[name]["command"]
        assert command[0] == "conduit", name
        assert _parser().parse_args(command[1:]).func.__name__ == func, name
    cmd = [yaml.safe_load(rest) for op, rest in _dockerfile() if op == "CMD"][-1]
    assert cmd[0] == "conduit" and _parser().parse_args(cmd[1:]).func.__name__ == "_serve"
    assert cmd == services["api"]["command"]


def test_env_names_are_settings_fields_and_parse() -> None:
    dist = _env_file(ROOT / "deploy" / "distributed.env")
    for env in ({}, dist):
        services = _compose(env)["services"]
        for name in ("api", "worker"):
            environment = {k: str(v) for k, v in services[name]["environment"].items()}
            s = settings_of(_image_env() | environment)
            assert s.model == "builtin:small-qwen2-vl" and str(s.home) == "/data"
    # embedded by default; with the env file the api and the worker share one Redis
    api = settings_of(_compose()["services"]["api"]["environment"])
    assert api.embedded and api.api_keys == []
    services = _compose(dist)["services"]
    urls = {settings_of(services[n]["environment"]).redis_url for n in ("api", "worker")}
    assert urls == {dist["CONDUIT_REDIS_URL"]}


def test_distributed_profile_has_redis_worker_and_a_shared_volume() -> None:
    compose = _compose(_env_file(ROOT / "deploy" / "distributed.env"))
    services = compose["services"]
    assert "profiles" not in services["api"]
    assert services["worker"]["profiles"] == ["distributed"]
    assert services["redis"]["profiles"] == ["distributed"]
    assert _env_file(ROOT / "deploy" / "distributed.env")["COMPOSE_PROFILES"] == "distributed"
    # api and worker mount one named volume at CONDUIT_HOME
    mounts = set()
    for name in ("api", "worker"):
        home = services[name]["environment"]["CONDUIT_HOME"]
        (volume,) = [v.split(":")[0] for v in services[name]["volumes"]
                     if v.split(":")[1] == home]
        mounts.add(volume)
    assert len(mounts) == 1 and mounts <= set(compose["volumes"])
    # the worker's broker is the redis service
    url = urlsplit(services["worker"]["environment"]["CONDUIT_REDIS_URL"])
    assert url.hostname == "redis" and url.port == 6379
    assert services["worker"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_redis_evicts_only_page_kv_and_persists() -> None:
    services = _compose()["services"]
    args = services["redis"]["command"]
    opts = dict(zip(args[1::2], args[2::2], strict=True))
    assert opts["--maxmemory-policy"].startswith("volatile-") and opts["--appendonly"] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    for name in ("api", "worker"):  # page KV carries a TTL, so it (and only it) is evictable
        assert int(services[name]["environment"]["CONDUIT_REDIS_KV_TTL_S"]) > 0


def test_gpu_override_gives_api_and_worker_a_gpu() -> None:
    override = yaml.safe_load((ROOT / "deploy" / "compose.gpu.yml").read_text())["services"]
    base = _compose()["services"]
    for name in ("api", "worker"):
        assert name in base
        for key in override[name]["environment"]:
            settings_field(key)
        assert override[name]["environment"]["CONDUIT_DEVICE"] == "cuda"
        (device,) = override[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def _packages() -> list[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({pattern.rstrip("*").rstrip(".") for pattern in include})


def test_dockerfile_copies_every_package_and_matches_the_chart_user() -> None:
    copies = {rest.split()[0]: rest.split()[1] for op, rest in _dockerfile() if op == "COPY"}
    for package in _packages():
        assert copies.get(package) == package, f"deploy/Dockerfile does not COPY {package}"
    assert _image_env()["CONDUIT_HOME"] == "/data"
    run = " ".join(rest for op, rest in _dockerfile() if op == "RUN")
    assert "--uid 10001" in run and ("USER", "10001:10001") in _dockerfile()


def test_the_build_context_the_dockerfile_copies_builds_the_package(tmp_path: Path) -> None:
    """What the COPY lines bring in is enough to build a wheel holding every package."""
    for op, rest in _dockerfile():
        if op != "COPY":
            continue
        *sources, dest = rest.split()
        for src in sources:
            target = tmp_path / (src if dest.endswith("/") or dest == "./" else dest)
            if (ROOT / src).is_dir():
                shutil.copytree(ROOT / src, target,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results"))
            else:
                shutil.copy(ROOT / src, target)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(tmp_path)],
                   check=True, capture_output=True, timeout=120)
    (wheel,) = (tmp_path / "dist").glob("conduit-*.whl")
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert set(_packages()) == {"conduit_core", "storage", "worker", "service"}
    assert {t for t in tops if not t.endswith(".dist-info")} == set(_packages())  # no lab
