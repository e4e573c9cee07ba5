"""Read docker-compose.yml, its env files and deploy/Dockerfile as Compose and Docker would:
`${VAR}` interpolation (with `-`, `:-`, `?` and `:?`), env files, the Dockerfile's instructions
and the environment its ENV lines give the image."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.chart import ROOT

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DISTRIBUTED_ENV = ROOT / "deploy" / "distributed.env"
_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


class MissingVariable(ValueError):
    """A `${VAR:?message}` whose variable is unset (or empty): Compose refuses to start."""


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR-default}`, `${VAR:-default}`, `${VAR?err}`, `${VAR:?err}`."""
    def sub(m: re.Match[str]) -> str:
        name, op, arg = m[1], m[2], m[3] or ""
        if op == ":-":
            return env.get(name) or arg
        if op == "-":
            return env.get(name, arg)
        if op in (":?", "?") and (name not in env or (op == ":?" and not env[name])):
            raise MissingVariable(f"{name}: {arg}")
        return env.get(name, "")
    return _VAR.sub(sub, text)


def _interpolated(node: Any, env: dict[str, str]) -> Any:
    """Compose interpolates string values after parsing: `${X:-}` is "", never null."""
    if isinstance(node, dict):
        return {k: _interpolated(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolated(v, env) for v in node]
    return interpolate(node, env) if isinstance(node, str) else node


def compose(env: dict[str, str] | None = None, path: Path = COMPOSE) -> dict[str, Any]:
    """The compose file parsed and interpolated with `env` (the shell and env file variables)."""
    data: dict[str, Any] = _interpolated(yaml.safe_load(path.read_text()), env or {})
    return data


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an env file (comments and blank lines skipped)."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in text.splitlines() if line.strip() and not line.startswith("#")]


def image_env() -> dict[str, str]:
    """The environment the image's ENV lines set."""
    env: dict[str, str] = {}
    for op, rest in dockerfile():
        if op == "ENV":
            for pair in shlex.split(rest):
                name, value = pair.split("=", 1)
                env[name] = value
    return env
