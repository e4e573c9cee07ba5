"""The settings of `service`: who may call it (keys, Host names) and how long a connection may
take over its request."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings

from worker.settings.fields import FLAT_ENV


class ServiceSettings(BaseSettings):
    """HTTP: keys, hosts and connections."""

    model_config = FLAT_ENV

    # keys and hosts
    api_keys: list[SecretStr] = Field(
        default_factory=list, description="Accepted bearer tokens; empty = no auth (loopback use)."
    )
    api_keys_file: Path | None = Field(
        None, description="JSON file of accepted keys: {key: tenant name} (rotate a key by "
        "mapping the new one to the same tenant) or a list of keys (tenant = a digest of the "
        "key). Adds to api_keys.",
    )
    metrics_key: SecretStr | None = Field(
        None, description="Bearer token that may read /metrics when API keys are configured "
        "(tenant keys cannot: the counters span every tenant).",
    )
    allow_open_network: bool = Field(
        False, description="Let `conduit serve` bind a non-loopback address with no API keys "
        "(warned at start). Without keys the service still answers only loopback Host names "
        "and allowed_hosts: use it for a container published on the host's loopback only, or "
        "behind a proxy that authenticates.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Host names (no port) answered besides localhost, "
        "*.localhost, 127.0.0.1 and [::1] when no API keys are configured; '*' answers any "
        "Host (no protection against DNS rebinding). With keys every Host is answered.",
    )

    # connections (`conduit serve`: service/connections.py; a reverse proxy adds its own)
    http_header_timeout_s: float = Field(
        15.0, gt=0, description="A connection must deliver a request's line and headers this "
        "soon after it opens or after its previous response; else it is closed.",
    )
    http_body_timeout_s: float = Field(
        60.0, gt=0, description="A request body must be complete this many seconds after its "
        "headers, plus a second for every http_body_min_rate bytes of it received (time the "
        "service itself stops reading is not counted); past it the request gets 408 (if "
        "nothing was answered yet) and the connection is closed.",
    )
    http_body_min_rate: int = Field(
        1024, ge=1, description="Bytes a second a request body must average, after its first "
        "http_body_timeout_s, to stay open.",
    )
    http_max_header_bytes: int = Field(
        65536, ge=1024, description="Largest request line plus headers; a request past it "
        "gets 431 and its connection is closed.",
    )
    http_keep_alive_s: float = Field(
        5.0, gt=0, description="How long an idle keep-alive connection stays open.",
    )
    http_max_connections: int = Field(
        1024, ge=8, le=1_000_000, description="Open client connections at most. A connection "
        "past it closes the oldest one still waiting for its request's headers, or itself "
        "when every one is in a request. The open-file limit is raised to fit it (lowered "
        "to fit the limit, with a warning, where it cannot be).",
    )
