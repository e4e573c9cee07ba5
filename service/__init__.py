"""The HTTP service (FastAPI) and the `conduit` command line."""
