"""Storage layer: the page-KV store (memory / Redis / disk tiers) and the metadata store."""
