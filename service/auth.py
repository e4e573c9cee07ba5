"""API keys and tenants: `CONDUIT_API_KEYS` (a list: each key's tenant is a digest of it) and
`CONDUIT_API_KEYS_FILE` (JSON `{key: tenant}`, so a rotated key keeps its tenant's data, or a
list). Keys are compared in constant time; the keys themselves are never stored or logged."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from pathlib import Path

from worker.settings import Settings

_TENANT = re.compile(r"^[\w.\-]{1,64}$")


def tenant_of_key(key: str) -> str:
    """A stable tenant name derived from an API key (the list form of the key settings)."""
    return "t_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def read_keys_file(path: Path) -> dict[str, str]:
    """`{key: tenant}` from a keys file; `ValueError` with the reason if it is malformed."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the API keys file {path}: {exc}") from exc
    if isinstance(data, list) and all(isinstance(k, str) and k for k in data):
        return {k: tenant_of_key(k) for k in data}
    if not isinstance(data, dict):
        raise ValueError(f"the API keys file {path} must hold a JSON object or list")
    out: dict[str, str] = {}
    for key, tenant in data.items():
        if not key or not isinstance(tenant, str) or not _TENANT.match(tenant):
            raise ValueError(f"the API keys file {path} maps a key to an invalid tenant name "
                             f"{tenant!r} (1-64 letters, digits, '_', '.', '-')")
        out[key] = tenant
    return out


@dataclass(frozen=True)
class KeyRing:
    """Accepted bearer tokens and their tenants, and the operator's metrics token."""

    tenants: dict[str, str]  # key -> tenant
    metrics_key: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        """Keys from `api_keys` and `api_keys_file` (the file wins for a key in both)."""
        tenants = {k.get_secret_value(): tenant_of_key(k.get_secret_value())
                   for k in settings.service.api_keys}
        if settings.service.api_keys_file is not None:
            tenants.update(read_keys_file(settings.service.api_keys_file))
        key = settings.service.metrics_key
        metrics = key.get_secret_value() if key else None
        return cls(tenants=tenants, metrics_key=metrics or None)

    @property
    def enabled(self) -> bool:
        """Whether callers must present a key (no keys = loopback use, tenant `default`)."""
        return bool(self.tenants)

    def tenant(self, token: str) -> str | None:
        """The tenant of a bearer token, or None if it is not an accepted key."""
        found = None
        for key, tenant in self.tenants.items():  # compare with every key: no timing leak
            if hmac.compare_digest(token.encode(), key.encode()):
                found = tenant
        return found

    def is_metrics_key(self, token: str) -> bool:
        """Whether the token is the operator's metrics key."""
        return self.metrics_key is not None and hmac.compare_digest(token.encode(),
                                                                   self.metrics_key.encode())


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, if any."""
    scheme, _, token = (header or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
