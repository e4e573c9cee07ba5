"""The pipeline: ingest (render, text/OCR, index, prefill pages) and answer (retrieve, load page
KV, assemble, refresh, decode). Runs in-process (embedded) or under Celery (distributed)."""
