"""What the settings groups share: each reads its fields from the environment under their flat
names (`CONDUIT_<FIELD>`, one namespace across the groups), and limits where 0 lifts them."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import SettingsConfigDict

# every group reads `CONDUIT_<FIELD>`: the names carry no group, so moving a field between
# groups changes no deployment
FLAT_ENV = SettingsConfigDict(env_prefix="CONDUIT_", env_file=None, extra="ignore")

_UNLIMITED = " 0 = unlimited."
_PER_TENANT = (" Unset: {keyed} when API keys are configured, unlimited without (one tenant)."
              + _UNLIMITED)


def cap(default: int, description: str) -> Any:
    """A limit where 0 lifts it: at least 0, its description ending in " 0 = unlimited."."""
    return Field(default, ge=0, description=description + _UNLIMITED)


def tenant_cap(description: str, keyed: str) -> Any:
    """A per-tenant limit whose default depends on API keys (unset: `keyed` with keys, none
    without) and where 0 lifts it."""
    return Field(None, ge=0, description=description + _PER_TENANT.format(keyed=keyed))
