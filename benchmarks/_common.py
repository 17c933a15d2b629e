"""Pieces the training benchmarks share."""
from __future__ import annotations

import sys


def launcher(n: int) -> list[str]:
    """The command prefix that starts ``n`` ranks: hvdlite's own launcher, which finds
    mpirun and sets the flags this machine needs (root, oversubscription, binding)."""
    return [sys.executable, "-m", "hvdlite.runner", "-np", str(n)]
