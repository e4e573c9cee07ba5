"""The lab's benches at real model shapes on one CUDA GPU (shell scripts beside their Python)."""

from __future__ import annotations


def environment(device: str) -> str:
    """One line describing the accelerator (or the CPU) a run uses."""
    import torch  # here, so that `conduit-lab --help` (lab.gpu.check_args) imports no torch

    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return (f"{props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
                f"CUDA {torch.version.cuda}")
    return f"CPU, torch {torch.__version__}"
