"""Collectives inside TensorFlow graphs: hvdlite's asynchronous graph ops against the
blocking ``py_function`` ops hvdlite falls back to, eager hvdlite, and raw MPI.

    python benchmarks/bench_tf_graph_ops.py [--quick] [--ranks 2] [--json-out F.json] [--results PATH]

Run it with plain ``python``: it starts its ranks itself through ``hvdlite-run`` (one
TensorFlow intra-op and one inter-op thread per rank). Every rank times, in the same
process and interleaved window by window:

* ``graph_ops``: a ``tf.function`` whose collective is hvdlite's ``HvdliteCollectives`` op
  (``hvdlite/tensorflow/_kernels.py``);
* ``py_function``: the same function traced with ``HVDLITE_TF_KERNEL=0``, the collective a
  blocking ``tf.py_function`` (hvdlite's fallback where the graph ops cannot be built);
* ``eager``: the same hvdlite call outside any graph;
* ``mpi4py``: ``MPI.COMM_WORLD.Allreduce`` / ``Allgatherv`` on NumPy arrays of the same
  bytes (the floor for the MPI path).

Rows: an allreduce of 4 KiB (latency), of 4 MiB, the MLP benchmark's 20 gradient
tensors (38 MB) as one grouped allreduce, and an allgather of 64 KiB per rank. Each
window is a barrier followed by a loop of calls; its time is the slowest rank's; a
row's figure is the median window, in ms per call. A Session row adds a TF1 graph of
20 independent 4 KiB allreduces run by a ``tf.compat.v1.Session`` with one inter-op
thread, which only the graph ops can run (the ``py_function`` version deadlocks, and is
not timed). Results are checked against NumPy before timing.

Output: one JSON line per row (ms per call for each configuration, and the ratios
``graph_ops / py_function`` and ``graph_ops / mpi4py``), then a table, and the results
file (``benchmarks/_common.py``: command, machine, date, commit, the rows), by default
``benchmarks/results/bench_tf_graph_ops.json``; ``--quick`` writes none unless
``--results PATH`` is given.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, ResultsRun, add_results_options, launcher, results_path  # noqa: E402

MLP_SHAPES = [(1024, 700)] + [(700,)] + [(700, 700), (700,)] * 18 + [(700, 10), (10,)]


def worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from mpi4py import MPI

    import hvdlite.tensorflow as hvd
    from hvdlite.tensorflow import _kernels
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    comm = MPI.COMM_WORLD
    if _kernels.library() is None:
        sys.exit(f"hvdlite's graph ops are not available: {_kernels.unavailable_reason()}")
    rng = np.random.default_rng(rank)

    def barrier():
        comm.Barrier()

    def timed(fn, calls: int) -> float:
        barrier()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        mine = (time.perf_counter() - t) / calls * 1e3
        return comm.allreduce(mine, op=MPI.MAX)

    def traced(make, kernel: bool):
        """A tf.function made by `make`, traced with or without the graph ops."""
        os.environ["HVDLITE_TF_KERNEL"] = "1" if kernel else "0"
        try:
            fn = make()
            fn()  # trace now, under this setting
        finally:
            os.environ["HVDLITE_TF_KERNEL"] = "1"
        ops = {op.type for op in fn.get_concrete_function().graph.get_operations()}
        want = "HvdliteCollectives" if kernel else "EagerPyFunc"
        assert want in ops, (kernel, sorted(ops))
        return fn

    rows = []

    def allreduce_row(name, arrays, calls):
        tensors = [tf.constant(a) for a in arrays]
        want = [comm.allreduce(a, op=MPI.SUM) for a in arrays]

        def make():
            return tf.function(lambda: hvd.grouped_allreduce(tensors, op=hvd.Sum, name=name))
        fns = {"graph_ops": traced(make, True), "py_function": traced(make, False),
               "eager": lambda: hvd.grouped_allreduce(tensors, op=hvd.Sum, name=name + ".eager")}
        for key, fn in fns.items():
            got = fn()
            assert all(np.allclose(np.asarray(g), w, rtol=1e-5) for g, w in zip(got, want)), key
        outs = [np.empty_like(a) for a in arrays]

        def mpi():
            for a, o in zip(arrays, outs):
                comm.Allreduce(a, o, op=MPI.SUM)
        fns["mpi4py"] = mpi
        return measure(name, fns, calls, sum(a.nbytes for a in arrays))

    def measure(name, fns, calls, nbytes):
        for fn in fns.values():  # warm up
            for _ in range(max(2, calls // 10)):
                fn()
        times = {k: [] for k in fns}
        order = list(fns)
        for w in range(args.windows):
            for k in (order if w % 2 == 0 else order[::-1]):
                times[k].append(timed(fns[k], calls))
        rec = {"row": name, "bytes": nbytes, "ranks": size,
               **{f"{k}_ms": statistics.median(v) for k, v in times.items()}}
        rec["graph_ops_over_py_function"] = rec["graph_ops_ms"] / rec["py_function_ms"]
        rec["graph_ops_over_mpi4py"] = rec["graph_ops_ms"] / rec["mpi4py_ms"]
        if rank == 0:
            print("BENCH_RESULT " + json.dumps(rec), flush=True)
        rows.append(rec)

    q = args.quick
    allreduce_row("allreduce_4KiB", [rng.random(1024, dtype=np.float32)], 50 if q else 400)
    allreduce_row("allreduce_4MiB", [rng.random(1 << 20, dtype=np.float32)], 5 if q else 40)
    allreduce_row("mlp_gradients_38MB", [rng.random(s, dtype=np.float32) for s in MLP_SHAPES], 2 if q else 10)

    # allgather of 64 KiB per rank
    part = rng.random((64, 256), dtype=np.float32)
    t_part = tf.constant(part)
    counts = [part.size] * size
    gathered = np.empty((64 * size, 256), np.float32)

    def make_gather():
        return tf.function(lambda: hvd.allgather(t_part, name="gather_64KiB"))
    fns = {"graph_ops": traced(make_gather, True), "py_function": traced(make_gather, False),
           "eager": lambda: hvd.allgather(t_part, name="gather_64KiB.eager"),
           "mpi4py": lambda: comm.Allgatherv(part, [gathered, counts])}
    want = np.concatenate(comm.allgather(part))
    for key in ("graph_ops", "py_function", "eager"):
        assert np.array_equal(np.asarray(fns[key]()), want), key
    measure("allgather_64KiB", fns, 50 if q else 400, part.nbytes)

    # A TF1 Session graph of 20 independent allreduces (graph ops only: the py_function
    # version deadlocks with one inter-op thread).
    g = tf.Graph()
    vals = [rng.random(1024, dtype=np.float32) for _ in range(20)]
    with g.as_default():
        outs = [hvd.allreduce(tf.constant(v), op=hvd.Sum, name=f"session.{i}") for i, v in enumerate(vals)]
    cfg = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=g, config=cfg) as sess:
        got = sess.run(outs)
        assert all(np.allclose(x, comm.allreduce(v, op=MPI.SUM), rtol=1e-5) for x, v in zip(got, vals))
        calls = 10 if q else 100
        times = [timed(lambda: sess.run(outs), calls) for _ in range(args.windows)]
    mpi_times = []
    out = np.empty(1024, np.float32)
    for _ in range(args.windows):
        mpi_times.append(timed(lambda: [comm.Allreduce(v, out, op=MPI.SUM) for v in vals], calls))
    rec = {"row": "session_20_allreduces_4KiB", "bytes": 20 * 4096, "ranks": size,
           "graph_ops_ms": statistics.median(times), "py_function_ms": None, "eager_ms": None,
           "mpi4py_ms": statistics.median(mpi_times), "graph_ops_over_py_function": None}
    rec["graph_ops_over_mpi4py"] = rec["graph_ops_ms"] / rec["mpi4py_ms"]
    if rank == 0:
        print("BENCH_RESULT " + json.dumps(rec), flush=True)
    hvd.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few calls: checks that it runs")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--windows", type=int, default=None, help="timed windows per configuration")
    p.add_argument("--json-out", default="")
    p.add_argument("--timeout", type=float, default=1800.0)
    add_results_options(p, "bench_tf_graph_ops")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.windows = args.windows or (3 if args.quick else 9)
    if args.worker:
        worker(args)
        return 0
    run = ResultsRun("bench_tf_graph_ops")
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = launcher(args.ranks) + [sys.executable, str(Path(__file__).resolve()), "--worker",
                                  "--windows", str(args.windows)] + (["--quick"] if args.quick else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        sys.exit(f"benchmark failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    rows = [json.loads(ln.split(" ", 1)[1]) for ln in proc.stdout.splitlines() if ln.startswith("BENCH_RESULT ")]
    for r in rows:
        print(json.dumps(r))

    def fmt(v, spec):
        return format(v, spec) if v is not None else "-".rjust(int(spec.split(".")[0]))
    print()
    head = (f"{'row':28} {'graph ops ms':>13} {'py_function ms':>15} {'eager ms':>9} {'mpi4py ms':>10} "
            f"{'ops/py_function':>16} {'ops/mpi4py':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['row']:28} {fmt(r['graph_ops_ms'], '13.3f')} {fmt(r['py_function_ms'], '15.3f')} "
              f"{fmt(r['eager_ms'], '9.3f')} {fmt(r['mpi4py_ms'], '10.3f')} "
              f"{fmt(r['graph_ops_over_py_function'], '16.3f')} {fmt(r['graph_ops_over_mpi4py'], '11.3f')}")
    print(f"\n({args.ranks} ranks, median of {args.windows} windows, the slowest rank's time per call; "
          f"'ops/py_function' < 1: the graph ops are faster than the py_function fallback)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    summary = [{k: r[k] for k in ("row", "graph_ops_over_py_function", "graph_ops_over_mpi4py")} for r in rows]
    run.write(results_path(args, "bench_tf_graph_ops", args.quick), rows, summary,
              {k: v for k, v in vars(args).items() if k != "worker"}, args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
