"""The lab: benchmarks, evaluations and the testbed, beside the product and never imported by it.

One subfolder per subject, each with its code, its `results/` and one `NOTES.md`; the command
line is `conduit-lab` (`lab/cli.py`). The lab may import every product layer; no product
module imports the lab (tests/test_layering.py).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

LAB = Path(__file__).resolve().parent
# The MMLongBench-Doc dev set, read where it lies: ../shared beside the repository.
DEVSET = LAB.parent.parent / "shared" / "devsets" / "mmlongbench-dev"


def results(subject: str) -> Path:
    """The results folder of one subject (`lab/<subject>/results`)."""
    return LAB / subject / "results"


def command_line() -> str:
    """The command as typed (`conduit-lab ...`), recorded in the results it writes."""
    return "conduit-lab " + shlex.join(sys.argv[1:])
