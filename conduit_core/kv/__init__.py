"""Page KV: prefill in the canonical page context, the pages crossing to the device in one
batched copy, the runtime's cache, its workspace of caches reused across requests and the
decode pool."""
