"""The lab's benches at real model shapes on one CUDA GPU (shell scripts beside their Python)."""

from __future__ import annotations

import torch


def environment(device: str) -> str:
    """One line describing the accelerator (or the CPU) a run uses."""
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return (f"{props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
                f"CUDA {torch.version.cuda}")
    return f"CPU, torch {torch.__version__}"
