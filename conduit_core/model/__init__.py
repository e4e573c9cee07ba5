"""Loading a VLM: builtins (random weights or the trained testbed), folders and hub ids, one
adapter per model family."""
