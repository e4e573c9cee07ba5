"""Page KV: prefill in the canonical page context, the pages crossing to the device in one
batched copy, the runtime's cache and the decode pool."""
