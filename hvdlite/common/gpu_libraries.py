"""Where hvdlite looks for the CUDA runtime and NCCL, which it opens only when the first
GPU tensor reaches it (nothing is compiled against them).

For each library the engine tries, in order:

1. the file named by ``HVDLITE_CUDART_LIBRARY`` / ``HVDLITE_NCCL_LIBRARY``;
2. a copy already loaded in this process (by PyTorch, say), so that hvdlite and the
   framework share one runtime;
3. the folders of NVIDIA's wheels (``nvidia-cuda-runtime-cu12``/``-cu13``,
   ``nvidia-nccl-cu12``/``-cu13``, which ``pip install 'hvdlite[gpu]'`` brings), then the
   folder of the libraries PyTorch bundles;
4. the system's dynamic loader (``LD_LIBRARY_PATH``, ``ldconfig``).

This module computes the folders of step 3 without importing any framework and hands
them to the engine; :func:`describe` reports what was found for ``--check-build``.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

LIBRARIES = ("cudart", "nccl")


def _nvidia_lib_folders() -> list[str]:
    """``.../site-packages/nvidia/<package>/lib`` of every NVIDIA wheel installed (the
    CUDA 12 wheels use one folder per package, the CUDA 13 ones ``nvidia/cu13/lib``)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    folders: list[str] = []
    for root in spec.submodule_search_locations:
        for lib in sorted(Path(root).glob("*/lib")):
            if lib.is_dir():
                folders.append(str(lib))
    return folders


def _torch_lib_folder() -> list[str]:
    """PyTorch's own ``lib`` folder (found without importing torch)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(list(spec.submodule_search_locations)[0]) / "lib"
    return [str(folder)] if folder.is_dir() else []


def search_folders() -> dict[str, list[str]]:
    """The folders searched before the system's, per library."""
    folders = _nvidia_lib_folders() + _torch_lib_folder()
    return {lib: list(folders) for lib in LIBRARIES}


#: Whether :func:`configure` has run (a front end checks it before calling it).
configured = False


def configure(core: Any) -> None:
    """Hand the search folders to the engine (once per process; cheap)."""
    global configured
    if configured:
        return
    for lib, folders in search_folders().items():
        core.set_library_search_folders(lib, folders)
    configured = True


def describe(core: Any) -> dict[str, Any]:
    """Whether the CUDA runtime and NCCL load here, which versions, from where, or what
    was searched. Opens them (a few hundred milliseconds for NCCL)."""
    configure(core)
    info = core.gpu_info()
    info["overrides"] = {name: os.environ.get(name) for name in ("HVDLITE_CUDART_LIBRARY", "HVDLITE_NCCL_LIBRARY")
                         if os.environ.get(name)}
    return info
