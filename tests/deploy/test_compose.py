"""docker-compose.yml, its env file and GPU override, and deploy/Dockerfile agree with the code:
real `conduit` subcommands, real Settings fields, one shared volume at CONDUIT_HOME, an image
that contains every package pyproject installs, and an api that serves the container network
only with API keys or the explicit open-network opt-in (`service.hardening.check_bind`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from service.auth import KeyRing
from service.cli import _parser
from service.hardening import check_bind, is_loopback_address
from tests.deploy.chart import ROOT, settings_field, settings_of
from tests.deploy.compose import (
    DISTRIBUTED_ENV,
    MissingVariable,
    compose,
    dockerfile,
    env_file,
    image_env,
)
from tests.deploy.processes import BASE_ENV, local_argv

KEYS = {"CONDUIT_API_KEYS": '["compose-test-key-0123456789"]'}


def _compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose file as `docker compose` reads it with the required keys set, and `env`."""
    return compose(KEYS | (env or {}))


def test_commands_are_real_conduit_subcommands() -> None:
    services = _compose()["services"]
    expected = {"api": "_serve", "worker": "_worker"}
    for name, func in expected.items():
        command = services[name]["command"]
        assert command[0] == "conduit", name
        assert _parser().parse_args(command[1:]).func.__name__ == func, name
    cmd = _image_cmd()
    assert cmd[0] == "conduit" and _parser().parse_args(cmd[1:]).func.__name__ == "_serve"
    assert cmd == services["api"]["command"]


def test_env_names_are_settings_fields_and_parse() -> None:
    dist = env_file(DISTRIBUTED_ENV)
    for env in ({}, dist):
        services = _compose(env)["services"]
        for name in ("api", "worker"):
            environment = {k: str(v) for k, v in services[name]["environment"].items()}
            s = settings_of(image_env() | environment)
            assert s.core.model == "builtin:small-qwen2-vl" and str(s.storage.home) == "/data"
    # embedded by default; with the env file the api and the worker share one Redis
    api = settings_of(_compose()["services"]["api"]["environment"])
    assert api.embedded
    assert [k.get_secret_value() for k in api.service.api_keys] == ["compose-test-key-0123456789"]
    services = _compose(dist)["services"]
    urls = {settings_of(services[n]["environment"]).storage.redis_url for n in ("api", "worker")}
    assert urls == {dist["CONDUIT_REDIS_URL"]}


def test_the_api_keys_are_required() -> None:
    """The api listens on the container network: compose refuses to start it without keys."""
    for env in ({}, {"CONDUIT_API_KEYS": ""}):
        with pytest.raises(MissingVariable, match="CONDUIT_API_KEYS"):
            compose(env)


OPEN_DEMO = {"CONDUIT_API_KEYS": "[]", "CONDUIT_ALLOW_OPEN_NETWORK": "true"}


def _image_cmd() -> list[str]:
    cmd: list[str] = [yaml.safe_load(rest) for op, rest in dockerfile() if op == "CMD"][-1]
    return cmd


def _bind_refusal(command: list[str], env: dict[str, str]) -> str | None:
    """What `conduit serve`, run as `command` with exactly `env`, says before it binds: None
    when it serves."""
    args = _parser().parse_args(command[1:])
    s = settings_of(env)
    return check_bind(args.host, keys=KeyRing.from_settings(s).enabled,
                      allow_open=args.allow_open or s.service.allow_open_network)


def test_compose_serves_the_network_only_with_keys_or_the_explicit_opt_in() -> None:
    for shell in (KEYS, OPEN_DEMO):
        for profile in ({}, env_file(DISTRIBUTED_ENV)):
            api = compose(shell | profile)["services"]["api"]
            env = image_env() | {k: str(v) for k, v in api["environment"].items()}
            s = settings_of(env)
            # keys, or the opt-in said
            assert s.service.api_keys or s.service.allow_open_network, shell
            args = _parser().parse_args(api["command"][1:])
            assert not is_loopback_address(args.host)  # the container network: it must
            assert _bind_refusal(api["command"], env) is None, shell
            # published on the host's loopback only (the keyless demo's Host names are too)
            assert all(p.startswith("127.0.0.1:") for p in api["ports"]), api["ports"]
    # no keys and no opt-in: compose passes it on, and the api refuses to serve
    api = compose({"CONDUIT_API_KEYS": "[]"})["services"]["api"]
    refusal = _bind_refusal(api["command"], image_env() | api["environment"])
    assert refusal and "CONDUIT_ALLOW_OPEN_NETWORK" in refusal


def test_the_image_serves_with_keys_a_keys_file_or_the_opt_in(tmp_path: Path) -> None:
    """The image's own command and environment: refused alone (a real process exits 2 and
    says what to set), served with keys, with a mounted keys file, or with the opt-in."""
    env = image_env() | {"CONDUIT_HOME": str(tmp_path / "home")}
    keys_file = tmp_path / "conduit-keys"
    keys_file.write_text('["image-test-key-0123456789"]')
    for extra in (KEYS, {"CONDUIT_API_KEYS_FILE": str(keys_file)},
                  {"CONDUIT_ALLOW_OPEN_NETWORK": "true"}):
        assert _bind_refusal(_image_cmd(), env | extra) is None, extra
    assert _bind_refusal(_image_cmd(), env) is not None
    run = subprocess.run(local_argv(_image_cmd()), env=BASE_ENV | env, capture_output=True,
                         timeout=300, cwd=tmp_path)
    assert run.returncode == 2, run.stderr.decode(errors="replace")[-2000:]
    said = run.stderr.decode()
    assert "refusing to serve 0.0.0.0" in said
    assert "CONDUIT_API_KEYS" in said and "CONDUIT_ALLOW_OPEN_NETWORK" in said


def test_distributed_profile_has_redis_worker_and_a_shared_volume() -> None:
    compose = _compose(env_file(DISTRIBUTED_ENV))
    services = compose["services"]
    assert "profiles" not in services["api"]
    assert services["worker"]["profiles"] == ["distributed"]
    assert services["redis"]["profiles"] == ["distributed"]
    assert env_file(DISTRIBUTED_ENV)["COMPOSE_PROFILES"] == "distributed"
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
    copies = {rest.split()[0]: rest.split()[1] for op, rest in dockerfile() if op == "COPY"}
    for package in _packages():
        assert copies.get(package) == package, f"deploy/Dockerfile does not COPY {package}"
    assert image_env()["CONDUIT_HOME"] == "/data"
    run = " ".join(rest for op, rest in dockerfile() if op == "RUN")
    assert "--uid 10001" in run and ("USER", "10001:10001") in dockerfile()


def test_the_build_context_the_dockerfile_copies_builds_the_package(tmp_path: Path) -> None:
    """What the COPY lines bring in is enough to build a wheel holding every package."""
    for op, rest in dockerfile():
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
