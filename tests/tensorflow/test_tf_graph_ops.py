"""hvdlite's asynchronous TensorFlow graph ops (hvdlite/tensorflow/_kernels.py).

* TF1 graphs run by tf.compat.v1.Session, several collectives in one graph, and typed
  errors inside graphs, on 2 and 3 ranks through the real launcher (tf_graph_checks.py,
  one launch per rank count, every check reported as its own test). With blocking
  py_function collectives instead (HVDLITE_TF_KERNEL=0), a Session graph of 20
  independent allreduces deadlocks at once on 2 ranks: each rank's one inter-op thread
  blocks in a different collective.
* The library is compiled once and cached: concurrent first uses build it once, a later
  process loads it without compiling.
* Where it cannot be built (no compiler), collectives in graphs fall back to
  tf.py_function with one warning and still compute the right values.

The ops are compiled with g++ against the installed TensorFlow; the tests that need
them skip only where no C++ compiler exists.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.launch import REPO, job_env
from tests.tensorflow import checks_launch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "tf_graph_worker.py"
LAUNCH_TIMEOUT_S = 600
RANK_COUNTS = [2, 3]

CHECKS = [
    "session_independent_allreduces_do_not_deadlock",
    "function_independent_allreduces",
    "session_mixed_collectives_in_one_graph",
    "session_broadcast_global_variables",
    "graph_errors_are_typed_and_recoverable",
    "graph_collective_fails_with_unknown_error_when_the_engine_stops",
]

HAVE_CXX = bool(os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++"))
needs_compiler = pytest.mark.skipif(not HAVE_CXX, reason="no C++ compiler: hvdlite's TensorFlow ops cannot be "
                                                         "built here (install g++ or set CXX)")

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                       reason="tensorflow is not installed (pip install hvdlite[tensorflow])"),
    pytest.mark.timeout(LAUNCH_TIMEOUT_S + 120),
]


@pytest.fixture(scope="module", params=RANK_COUNTS, ids=[f"np{n}" for n in RANK_COUNTS])
def run(request, tmp_path_factory):
    if not HAVE_CXX:
        pytest.skip("no C++ compiler: hvdlite's TensorFlow ops cannot be built here")
    n = request.param
    return checks_launch.launch(n, WORKER, tmp_path_factory.mktemp(f"tf_graph_np{n}"), LAUNCH_TIMEOUT_S)


def test_check_list(run):
    checks_launch.assert_ran_exactly(run, CHECKS)


@pytest.mark.parametrize("check", CHECKS)
def test_graph(run, check):
    checks_launch.assert_passed(run, check)


# ---- building and caching the library ---------------------------------------------------

LOAD_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from hvdlite.tensorflow import _kernels
    if len(sys.argv) > 1:  # start together with the other processes
        while time.time() < float(sys.argv[1]):
            time.sleep(0.01)
    lib = _kernels.library()
    print(json.dumps(None if lib is None else {
        "built": lib.built, "path": str(lib.path), "seconds": lib.compile_seconds,
        "mtime_ns": os.stat(lib.path).st_mtime_ns}))
""")


def load_in_subprocesses(cache: Path, count: int) -> list[dict]:
    """`count` fresh processes that load the library at the same moment (from `cache`)."""
    env = job_env({"HVDLITE_CACHE_DIR": str(cache), "TF_CPP_MIN_LOG_LEVEL": "3"})
    start = __import__("time").time() + (20 if count > 1 else 0)  # after TensorFlow's import
    procs = [subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT] + ([str(start)] if count > 1 else []),
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(count)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
        assert results[-1] is not None, f"the library was not available:\n{err[-3000:]}"
    return results


@needs_compiler
@pytest.mark.timeout(1200)
def test_library_is_built_once_and_then_loaded_from_the_cache(tmp_path):
    """Three processes that need the library at once on an empty cache: one compiles it,
    the others wait for it and load the same file. A fourth process later loads it
    without compiling (the file is not rewritten)."""
    first = load_in_subprocesses(tmp_path, 3)
    assert sum(r["built"] for r in first) == 1, first
    assert len({r["path"] for r in first}) == 1 and len({r["mtime_ns"] for r in first}) == 1, first
    builder = next(r for r in first if r["built"])
    assert builder["seconds"] > 0
    path = Path(builder["path"])
    assert path.is_relative_to(tmp_path / "tf-ops") and path.name == "hvdlite_tf_ops.so"
    assert json.loads((path.parent / "build.json").read_text())["compile_seconds"] > 0
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")], "a temporary file was left"
    later = load_in_subprocesses(tmp_path, 1)[0]
    assert not later["built"] and later["path"] == builder["path"] and later["mtime_ns"] == builder["mtime_ns"]


FALLBACK_SCRIPT = textwrap.dedent("""
    import os, warnings
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np, tensorflow as tf
    import hvdlite.tensorflow as hvd
    from hvdlite.tensorflow import _kernels
    hvd.init()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, name="fallback"))
        got = f(tf.constant([1.5, 2.5]))
    ops = {op.type for op in f.get_concrete_function(tf.TensorSpec([2], tf.float32)).graph.get_operations()}
    assert np.allclose(got.numpy(), [1.5, 2.5]), got
    assert "EagerPyFunc" in ops and "HvdliteCollectives" not in ops, ops
    messages = [str(w.message) for w in caught if "TensorFlow ops are not available" in str(w.message)]
    assert len(messages) == 1, [str(w.message) for w in caught]
    assert "no-such-compiler" in messages[0] and "py_function" in messages[0], messages[0]
    print("fallback ok")
    hvd.shutdown()
""")


def test_without_a_compiler_graph_collectives_fall_back_to_py_function(tmp_path):
    """No usable compiler (CXX names one that does not exist) and nothing cached: one
    warning says why, and a tf.function allreduce still works (through py_function)."""
    env = job_env({"HVDLITE_CACHE_DIR": str(tmp_path), "CXX": "no-such-compiler"})
    proc = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and "fallback ok" in proc.stdout, proc.stderr[-4000:]
    assert not (tmp_path / "tf-ops").exists() or not list((tmp_path / "tf-ops").rglob("*.so"))
