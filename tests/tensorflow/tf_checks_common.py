"""Shared set-up of the TensorFlow checks run by tf_worker.py: hvdlite initialised with
one intra-op and one inter-op thread, a registry of checks, and helpers that record a
mismatch instead of raising (so one rank never leaves the others waiting in a
collective)."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import ml_dtypes  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
CHECKS = []
FAILURES: list[str] = []


def check(fn):
    CHECKS.append(fn)
    return fn


def expect_close(got, want, what, rtol=1e-6, atol=1e-6):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        FAILURES.append(f"{what}: shape {got.shape} != expected {want.shape}")
        return
    if got.dtype == ml_dtypes.bfloat16 or want.dtype == ml_dtypes.bfloat16:
        got, want = got.astype(np.float32), want.astype(np.float32)
    if not np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol):
        FAILURES.append(f"{what}: got {got.ravel()[:6]} expected {want.ravel()[:6]} "
                        f"(max err {np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))})")


def expect(cond, what):
    if not cond:
        FAILURES.append(what)


def data(r, shape, dtype, seed=0, low=-3, high=3):
    rng = np.random.default_rng(1000 * seed + r)
    if np.dtype(dtype).kind in "iu":
        lo = 0 if np.dtype(dtype).kind == "u" else low
        return rng.integers(lo, high + 1, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.uniform(low, high, size=shape).astype(dtype)



def as_tf(a, dtype_name):
    if dtype_name == "bfloat16":
        return tf.cast(tf.constant(a.astype(np.float32)), tf.bfloat16)
    return tf.constant(a)


def np_data(r, shape, dtype_name, seed=0, **kw):
    if dtype_name == "bfloat16":
        return data(r, shape, np.float32, seed, **kw).astype(ml_dtypes.bfloat16).astype(np.float32)
    return data(r, shape, np.dtype(dtype_name), seed, **kw)


MODES = {"eager": lambda f: f, "function": lambda f: tf.function(f)}


def graph_ops_available():
    """Whether graphs use hvdlite's own ops (compiled on first use; where no C++ compiler
    exists, graphs fall back to py_function ops, whose errors TensorFlow reports as
    UnknownError, InvalidArgumentError or UnimplementedError by the Python type)."""
    from hvdlite.tensorflow import _kernels
    return _kernels.library() is not None




def run_checks() -> None:
    """A check worker's main (``tf_worker.py``, ``tf_graph_worker.py``): runs the registered
    checks (those named after OUT_DIR on the command line, or all) and writes
    OUT_DIR/rank{r}.json mapping check name -> "ok" or the failure description, after
    every check, so that a launch killed by its timeout still reports what finished."""
    import json
    import sys
    import traceback

    out_dir = sys.argv[1]
    only = set(sys.argv[2:])
    results = {}
    for fn in CHECKS:
        if only and fn.__name__ not in only:
            continue
        FAILURES.clear()
        try:
            fn()
        except Exception:
            FAILURES.append("exception:\n" + traceback.format_exc())
        results[fn.__name__] = "ok" if not FAILURES else "\n".join(FAILURES)
        hvd.allgather_object(fn.__name__)  # keep ranks in step between checks
        with open(os.path.join(out_dir, f"rank{R}.json"), "w") as f:
            json.dump(results, f, indent=1)
    hvd.shutdown()
