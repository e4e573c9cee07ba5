"""The one `Settings` object of a deployment, read by entry points only, in four groups, one per
layer it configures: `service` (HTTP), `worker` (the pipeline), `storage` and `core` (the model
and the reuse runtime).

Every field keeps its flat environment name, `CONDUIT_<FIELD>` (`CONDUIT_API_KEYS` sets
`settings.service.api_keys`): the names form one namespace across the groups, and a field that
moves between groups renames nothing a deployment sets. The constructor takes the same flat
names (`Settings(home=..., model=...)`) as well as whole groups. Entry points (the CLI, the
FastAPI app factory, the Celery worker) build a `Settings` and pass plain values down; nothing
below `worker` reads the environment.
"""

from worker.settings.core import CoreSettings
from worker.settings.groups import GROUPS, Settings
from worker.settings.pipeline import WorkerSettings
from worker.settings.service import ServiceSettings
from worker.settings.storage import StorageSettings

__all__ = ["GROUPS", "CoreSettings", "ServiceSettings", "Settings", "StorageSettings",
           "WorkerSettings"]
