"""Argument types shared by the lab's commands."""

from __future__ import annotations

import argparse


def ints(text: str) -> list[int]:
    """A comma-separated list of whole numbers ("1,8,32")."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}"
                                         ) from None


def floats(text: str) -> list[float]:
    """A comma-separated list of numbers ("0.05,0.1,0.2")."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}"
                                         ) from None
