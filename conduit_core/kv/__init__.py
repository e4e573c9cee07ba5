"""Page KV: prefill in the canonical page context, staging on the host, the runtime's cache and
the decode pool."""
