"""The web page: `GET /` serves `service/static/index.html`; its scripts and styles are under
`/static/`. Plain files shipped inside the package (no CDN, no build step), so the page works
offline and uses only the public API."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"

router = APIRouter(include_in_schema=False)


@router.get("/")
def index() -> FileResponse:
    """The single-page UI."""
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html",
                        headers={"Cache-Control": "no-cache"})


def mount_ui(app: FastAPI) -> None:
    """Serve the page at `/` and its assets at `/static/`."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
