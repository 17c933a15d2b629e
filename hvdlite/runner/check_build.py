"""``hvdlite-run --check-build``: report what this hvdlite install can do.

Everything here is found without importing a framework or hvdlite's compiled
core: frameworks are looked up with :func:`importlib.util.find_spec` and their
versions read from package metadata, and the core is looked up as a file next
to the package.  So the report works on a half-built tree and costs well under
a second even where TensorFlow is installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

from hvdlite.runner.mpirun import LaunchError, find_mpirun, mpirun_version

__all__ = ["check_build_report", "hvdlite_version", "find_core_extension", "framework_status"]


def hvdlite_version() -> str:
    """hvdlite's version: ``hvdlite.__version__`` if set, else package metadata."""
    pkg = sys.modules.get("hvdlite")
    version = getattr(pkg, "__version__", None) if pkg is not None else None
    if isinstance(version, str) and version:
        return version
    try:
        return importlib.metadata.version("hvdlite")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _package_dirs() -> list[str]:
    """Directories of the ``hvdlite`` package (several for a namespace package)."""
    pkg = sys.modules.get("hvdlite")
    paths = list(getattr(pkg, "__path__", []) or [])
    if not paths:
        paths = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    return paths


def find_core_extension() -> str | None:
    """Path of the compiled core ``hvdlite/_core*.so`` if built, without importing it."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    for directory in _package_dirs():
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if name.startswith("_core") and any(name.endswith(s) for s in suffixes):
                stem = name[: -len(next(s for s in suffixes if name.endswith(s)))]
                if stem == "_core":
                    return os.path.join(directory, name)
    return None


def _distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def framework_status() -> dict[str, tuple[bool, str]]:
    """``{"PyTorch": (available, detail), "TensorFlow": (...)}`` without importing them.

    A framework counts as available when its module can be found and hvdlite's
    adapter for it is present in this install.
    """
    frameworks = {
        "PyTorch": ("torch", ("torch",), "hvdlite.torch"),
        "TensorFlow": (
            "tensorflow",
            ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly"),
            "hvdlite.tensorflow",
        ),
    }
    status: dict[str, tuple[bool, str]] = {}
    for label, (module, dists, adapter) in frameworks.items():
        if not _module_available(module):
            status[label] = (False, "not installed")
            continue
        version = _distribution_version(*dists) or "version unknown"
        if not _module_available(adapter):
            status[label] = (False, f"{version} installed, but hvdlite's adapter is missing")
            continue
        status[label] = (True, version)
    return status


_GPU_PROBE = ("import json\n"
              "from hvdlite.common import basics, gpu_libraries\n"
              "print(json.dumps(gpu_libraries.describe(basics._load_core())))\n")


def gpu_status() -> dict[str, Any] | None:
    """What the engine finds of the CUDA runtime and NCCL on this machine (see
    :func:`hvdlite.common.gpu_libraries.describe`), asked in a child process so that the
    launcher itself never loads the engine; None if the engine cannot be asked."""
    try:
        proc = subprocess.run([sys.executable, "-c", _GPU_PROBE], capture_output=True, text=True, timeout=120)
        return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def _first_line(text: str) -> str:
    """The engine's message without the list of places it searched (see :func:`_searched`)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line.removesuffix("Searched:").rstrip().removesuffix(".")


def _searched(text: str, indent: str = "          ") -> list[str]:
    """The places a library was looked for, one per line: the lines after the first of
    the engine's message (``... Searched:`` then one indented line per place)."""
    return [indent + line.strip() for line in text.strip().splitlines()[1:] if line.strip()]


def _box(flag: bool) -> str:
    return "[X]" if flag else "[ ]"


def _nccl_lines(gpu: dict[str, Any] | None) -> list[str]:
    if gpu is None:
        return [f"    {_box(False)} NCCL (the engine could not be asked)"]
    nccl = gpu["nccl"]
    if nccl["loaded"]:
        return [f"    {_box(True)} NCCL {nccl['version']} (loaded at run time from {nccl['path']})"]
    error = nccl.get("error", "")
    searched = _searched(error)
    return [f"    {_box(False)} NCCL (not found: {_first_line(error)}; pip install 'hvdlite[gpu]')"
            + (". Searched:" if searched else ""), *searched]


def _cuda_lines(gpu: dict[str, Any] | None) -> list[str]:
    if gpu is None:
        return ["CUDA runtime: unknown"]
    cuda = gpu["cuda"]
    if not cuda["loaded"]:
        error = cuda.get("error", "")
        searched = _searched(error, indent="    ")
        return [f"CUDA runtime: not found ({_first_line(error)}); GPU tensors need it"
                + (". Searched:" if searched else ""), *searched]
    v = int(cuda["runtime_version"])
    return [f"CUDA runtime: {v // 1000}.{v % 1000 // 10} [{cuda['path']}], "
            f"{cuda['device_count']} GPU(s) visible"]


def check_build_report(mpirun: str | None = None) -> str:
    """The text that ``hvdlite-run --check-build`` prints.

    ``mpirun`` overrides the launcher's search for the MPI launcher.
    """
    version = hvdlite_version()
    title = f"hvdlite v{version}:" if version != "unknown" else "hvdlite (version unknown):"
    lines = [title, "", "Available Frameworks:"]
    for label, (ok, detail) in framework_status().items():
        lines.append(f"    {_box(ok)} {label} ({detail})")

    core = find_core_extension()
    core_note = "" if core else " (core extension not built)"
    gpu = gpu_status() if core else None
    lines += [
        "",
        "Available Controllers:",
        f"    {_box(core is not None)} MPI{core_note}",
        f"    {_box(False)} Gloo (not supported)",
        "",
        "Available Tensor Operations:",
        *_nccl_lines(gpu),
        f"    {_box(core is not None)} MPI{core_note}",
        f"    {_box(False)} Gloo (not supported)",
        "",
        "Features:",
    ]
    for feature in ("Timeline", "Response cache", "Tensor fusion", "Stall inspector"):
        lines.append(f"    {_box(core is not None)} {feature}{core_note}")

    lines += ["", f"Core extension: {core if core else 'NOT BUILT (pip install -e . builds it)'}"]
    lines += _cuda_lines(gpu)
    try:
        path = mpirun or find_mpirun()
    except LaunchError as exc:
        lines.append(f"MPI library: not found ({exc})")
    else:
        first_line, _ = mpirun_version(path)
        lines.append(f"MPI library: {first_line} [{path}]")
    return "\n".join(lines)
