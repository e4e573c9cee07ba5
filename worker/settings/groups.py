"""`Settings`: the four groups in one object, the flat names routed to their groups, and what
derives from more than one group (the deployment's form, where models are kept)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from worker.settings.core import CoreSettings
from worker.settings.pipeline import WorkerSettings
from worker.settings.service import ServiceSettings
from worker.settings.storage import StorageSettings

# group name -> its settings (each reads its own fields from `CONDUIT_<FIELD>`; a field name
# is in one group only)
GROUPS: dict[str, type[BaseSettings]] = {
    "service": ServiceSettings, "worker": WorkerSettings, "storage": StorageSettings,
    "core": CoreSettings,
}


class Settings(BaseSettings):
    """Every knob of a conduit deployment, by the layer it configures. Unset Redis URL =
    embedded (one process)."""

    model_config = SettingsConfigDict(extra="ignore")

    service: ServiceSettings = Field(default_factory=ServiceSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    core: CoreSettings = Field(default_factory=CoreSettings)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The constructor's values only: each group reads the environment itself when it is
        built, under its fields' flat names, below the values it is given."""
        return (init_settings,)

    @model_validator(mode="before")
    @classmethod
    def _flat_names_to_groups(cls, data: Any) -> Any:
        """Route flat names (`home=...`) into their groups (over a group given whole)."""
        if not isinstance(data, dict):
            return data
        out = {name: data[name] for name in GROUPS if name in data}
        for name, group in GROUPS.items():
            flat = {field: data[field] for field in group.model_fields if field in data}
            if flat:
                given = out.get(name, {})
                out[name] = {**(given.model_dump() if isinstance(given, BaseModel) else given),
                             **flat}
        return out

    @property
    def embedded(self) -> bool:
        """True when no Redis URL is set: API, worker and stores share one process."""
        return not self.storage.redis_url

    @property
    def model_cache_dir(self) -> Path:
        """Where builtin models are materialised."""
        return self.storage.home / "models"
