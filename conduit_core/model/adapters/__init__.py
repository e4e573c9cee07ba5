"""Model-family adapters, one file per family; `base.VLMAdapter` is the seam."""
