"""PyTorch training throughput: single process vs DistributedDataParallel vs hvdlite.

    python benchmarks/bench_torch_training.py [--quick] [--models mlp,resnet] [--rounds R]
                                              [--ranks R] [--hosts N [--rate 1gbit]]
                                              [--results PATH]

Run it with plain ``python`` (not under mpirun): it starts its peers itself, one after
the other, each with ``torch.set_num_threads(1)`` in every process:

* ``single``: one process (this one), plain ``torch.optim.SGD``;
* ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` with the gloo backend on 2
  processes started by ``torch.multiprocessing`` (``broadcast_buffers=False``, as a
  Horovod user would not synchronise BatchNorm buffers either);
* ``hvdlite``: ``hvdlite.torch.DistributedOptimizer`` on 2 processes started by
  ``hvdlite-run`` (``python -m hvdlite.runner``).

Models (defined in ``examples/pytorch/pytorch_synthetic_benchmark.py``): ``mlp``, 20
Linear+ReLU layers 1024 -> 700 (x19) -> 10, 9.56 M parameters in 40 tensors, batch 64
per rank -- communication-heavy; ``resnet``, a ResNet-like CNN on 32x32 images, 2.78 M
parameters in 47 tensors, batch 32 per rank -- compute-heavy. Data are synthetic.

Each configuration runs ``--warmup`` steps, then ``--windows`` timed windows of
``--steps`` steps (for 2 ranks a window starts with a barrier and lasts as long as the
slower rank); its throughput is the median window, in samples per second over all
ranks. With ``--rounds R`` the three configurations are run R times in turn
(single, ddp, hvdlite, single, ...) and the median round is reported with the min-max
spread; the ``paired`` columns are the medians of the ratios taken within each round
(steadier while the machine's speed drifts between rounds). Scaling efficiency = 2-rank
samples/s / (2 x single-process samples/s).

A fourth configuration, ``independent``, runs 2 single-process trainings at once with
no communication at all (windows aligned by a barrier). Its efficiency is the ceiling
this machine's shared caches and memory bandwidth allow any data-parallel library;
``hvd/ceiling`` is hvdlite's throughput over it, i.e. what communication costs.

``--hosts N`` (root only) spreads the ranks of ``ddp`` and ``hvdlite`` over N hosts
emulated on this machine (``tests/hosts/emulated.py``: network namespaces on a bridge,
each host's link limited to ``--rate`` both ways), ``--ranks`` / N on each, filled in
host order: hvdlite through ``hvdlite-run -H h1:k,h2:k``, DDP by starting each rank
inside its host's namespace (gloo over the hosts' links, rendezvous at h1's address).
``single`` and ``independent`` have no communication and stay on this host; every
"host" still shares this machine's cores.

Output: one JSON line per measurement, then a table with hvdlite/DDP and the
efficiencies, and the results file (``benchmarks/_common.py``: command, machine, date,
commit, every run and the table), by default
``benchmarks/results/bench_torch_training.json``. ``--quick`` makes every window short:
it checks that everything runs, the numbers are only indicative, and it writes no results
file unless ``--results PATH`` is given.
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

from _common import (ResultsRun, add_hosts_options, add_results_options, emulated_hosts_for, free_port,  # sibling module
                     host_address, host_of_rank, launcher, load_synthetic_models, on_host, results_path)

REPO = Path(__file__).resolve().parents[1]
BATCH = {"mlp": 64, "resnet": 32}
# With --hosts: the emulated hosts (tests.hosts.emulated.EmulatedHosts) and the ranks on
# each. Kept out of ``args``, which is pickled for the spawned processes.
HOSTS: Any = None
LAYOUT: list[int] = []


def load_models() -> Any:
    return load_synthetic_models()


def make_training(model_name: str, seed: int) -> tuple[Any, Any, Callable[[], None]]:
    """Model, optimizer and a step function on a fixed synthetic batch."""
    import torch

    mod = load_models()
    torch.manual_seed(0)
    model = mod.MODELS[model_name][0]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data, target = mod.synthetic_batch(model_name, BATCH[model_name], seed=seed)
    return model, opt, (data, target)


def timed_windows(step: Callable[[], None], warmup: int, steps: int, windows: int,
                  sync: Callable[[float], float]) -> list[float]:
    """Seconds per window; ``sync(t)`` aligns ranks before a window and returns the
    slowest rank's time for it."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(windows):
        sync(0.0)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        times.append(sync(time.perf_counter() - t0))
    return times


# ----------------------------------------------------------------------------- single

def run_single(model_name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    model, opt, (data, target) = make_training(model_name, seed=0)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    times = timed_windows(step, args.warmup, args.steps, args.windows, lambda t: t)
    return result(model_name, "single", 1, times, args)


# ------------------------------------------------------------------------ independent

def _independent_worker(rank: int, model_name: str, args: argparse.Namespace, barrier: Any,
                        queue: Any) -> None:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    model, opt, (data, target) = make_training(model_name, seed=rank)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    def sync(t: float) -> float:
        barrier.wait()  # start windows together; no data moves between the processes
        return t

    queue.put(timed_windows(step, args.warmup, args.steps, args.windows, sync))


def run_independent(model_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """``ranks`` single-process trainings at once, with no communication at all: what
    the machine's cores, caches and memory bandwidth allow, the ceiling for any
    data-parallel library here."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    barrier = ctx.Barrier(args.ranks)
    os.environ["OMP_NUM_THREADS"] = "1"
    mp.start_processes(_independent_worker, args=(model_name, args, barrier, queue),
                       nprocs=args.ranks, join=True, start_method="spawn")
    per_rank = [queue.get() for _ in range(args.ranks)]
    return result(model_name, "independent", args.ranks, [max(w) for w in zip(*per_rank)], args)


# -------------------------------------------------------------------------------- DDP

def _ddp_worker(rank: int, world: int, port: int, model_name: str, args: argparse.Namespace,
                queue: Any) -> None:
    times = ddp_train(rank, world, f"tcp://127.0.0.1:{port}", model_name, args)
    if rank == 0:
        queue.put(times)


def ddp_train(rank: int, world: int, init_method: str, model_name: str,
              args: argparse.Namespace) -> list[float]:
    """One DDP rank's timed windows (every rank returns the slowest rank's)."""
    import warnings

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    warnings.filterwarnings("ignore", category=FutureWarning)  # broadcast_buffers naming
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    model, opt, (data, target) = make_training(model_name, seed=rank)
    ddp = DDP(model, broadcast_buffers=False)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(ddp(data), target).backward()
        opt.step()

    def sync(t: float) -> float:
        x = torch.tensor([t])
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
        return float(x.item())

    times = timed_windows(step, args.warmup, args.steps, args.windows, sync)
    dist.barrier()
    dist.destroy_process_group()
    return times


def ddp_host_worker(args: argparse.Namespace) -> None:
    """One DDP rank started on an emulated host by :func:`run_ddp_on_hosts`; rank 0
    prints the windows' times."""
    times = ddp_train(args.ddp_rank, args.ranks, f"tcp://{args.ddp_master}", args.worker_model, args)
    if args.ddp_rank == 0:
        print("DDP_TIMES " + json.dumps(times), flush=True)


_ddp_port = 29500


def run_ddp_on_hosts(model_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """DDP with each rank started inside its emulated host's network namespace: gloo
    binds to the host's ``eth0`` (its rate-limited link) and meets at h1's address."""
    global _ddp_port
    _ddp_port += 1  # a fresh port in h1's namespace for every run: no TIME_WAIT leftovers
    master = f"{host_address(HOSTS, 0)}:{_ddp_port}"
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0")
    procs = []
    for rank in range(args.ranks):
        cmd = on_host(HOSTS, host_of_rank(rank, LAYOUT)) + [
            sys.executable, str(Path(__file__).resolve()), "--worker-model", model_name,
            "--ddp-rank", str(rank), "--ddp-master", master, "--ranks", str(args.ranks),
            "--warmup", str(args.warmup), "--steps", str(args.steps), "--windows", str(args.windows)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    deadline = time.monotonic() + args.timeout
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append((proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        sys.exit(f"DDP on emulated hosts timed out after {args.timeout} s")
    line = next((ln for ln in outs[0][1].splitlines() if ln.startswith("DDP_TIMES ")), None)
    if any(rc != 0 for rc, _, _ in outs) or line is None:
        sys.exit("DDP on emulated hosts failed:\n" + "\n".join(
            f"rank {r}: exit {rc}\n{o[-2000:]}\n{e[-3000:]}" for r, (rc, o, e) in enumerate(outs)))
    return result(model_name, "ddp", args.ranks, json.loads(line.split(" ", 1)[1]), args)


def run_ddp(model_name: str, args: argparse.Namespace) -> dict[str, Any]:
    if HOSTS is not None:
        return run_ddp_on_hosts(model_name, args)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    os.environ["OMP_NUM_THREADS"] = "1"
    mp.start_processes(_ddp_worker, args=(args.ranks, free_port(), model_name, args, queue),
                       nprocs=args.ranks, join=True, start_method="spawn")
    return result(model_name, "ddp", args.ranks, queue.get(), args)


# ---------------------------------------------------------------------------- hvdlite

def hvdlite_worker(args: argparse.Namespace) -> None:
    """Runs under the launcher: hvdlite's DistributedOptimizer, JSON on rank 0's stdout."""
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    model, opt, (data, target) = make_training(args.worker_model, seed=hvd.rank())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    def sync(t: float) -> float:
        return float(hvd.allreduce(torch.tensor([t]), op=hvd.Max, name="bench.sync").item())

    times = timed_windows(step, args.warmup, args.steps, args.windows, sync)
    if hvd.rank() == 0:
        print("HVDLITE_TIMES " + json.dumps(times), flush=True)
    hvd.shutdown()


def run_hvdlite(model_name: str, args: argparse.Namespace) -> dict[str, Any]:
    hosts = ["-H", HOSTS.host_spec(LAYOUT)] if HOSTS is not None else []
    cmd = launcher(args.ranks) + hosts + [sys.executable, str(Path(__file__).resolve()),
                                  "--worker-model", model_name, "--warmup", str(args.warmup),
                                  "--steps", str(args.steps), "--windows", str(args.windows)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    if HOSTS is not None:
        env.update(HOSTS.env())
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("HVDLITE_TIMES ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"hvdlite run failed ({proc.returncode}): {' '.join(cmd)}\n"
                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return result(model_name, "hvdlite", args.ranks, json.loads(line.split(" ", 1)[1]), args)


# ---------------------------------------------------------------------------- report

def result(model: str, mode: str, ranks: int, times: list[float], args: argparse.Namespace) -> dict[str, Any]:
    samples = BATCH[model] * ranks * args.steps
    rates = [samples / t for t in times]
    out = {"model": model, "mode": mode, "ranks": ranks, "batch_per_rank": BATCH[model],
           "samples_per_s": statistics.median(rates), "window_rates": rates,
           "step_ms": 1000 * statistics.median(times) / args.steps, "threads_per_rank": 1}
    if HOSTS is not None and mode in ("ddp", "hvdlite"):
        out["hosts"] = HOSTS.host_spec(LAYOUT)
        out["rate"] = HOSTS.rate
    return out


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["samples_per_s"] for r in rounds]
    out = dict(rounds[len(rounds) // 2] if len(rounds) % 2 else rounds[0])
    out.pop("window_rates", None)
    out["samples_per_s"] = statistics.median(rates)
    out["spread"] = [min(rates), max(rates)]
    out["rounds"] = len(rounds)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short windows, one round")
    p.add_argument("--models", default="mlp,resnet")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="steps per timed window")
    p.add_argument("--windows", type=int, default=None)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json-out", default="", help="also write all results to this JSON file")
    add_hosts_options(p)
    add_results_options(p, "bench_torch_training")
    p.add_argument("--worker-model", default="", help=argparse.SUPPRESS)
    p.add_argument("--ddp-rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--ddp-master", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (1 if quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (2 if quick else 5)
    args.steps = args.steps or (3 if quick else 20)
    args.windows = args.windows or (3 if quick else 5)
    if args.worker_model:
        if args.ddp_rank >= 0:
            ddp_host_worker(args)
        else:
            hvdlite_worker(args)
        return 0
    if not args.hosts:
        return run_benchmark(args)
    global HOSTS, LAYOUT
    with emulated_hosts_for(p, args) as (HOSTS, LAYOUT):
        print(f"ddp and hvdlite on emulated hosts {HOSTS.host_spec(LAYOUT)}, links {args.rate} "
              f"both ways ({HOSTS.subnet}); single and independent on this host", flush=True)
        try:
            return run_benchmark(args)
        finally:
            HOSTS = None


def run_benchmark(args: argparse.Namespace) -> int:
    run = ResultsRun("bench_torch_training")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    runners = {"single": run_single, "independent": run_independent, "ddp": run_ddp,
               "hvdlite": run_hvdlite}
    collected: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for model in models:
        for rnd in range(args.rounds):
            for mode, fn in runners.items():
                res = fn(model, args)
                res["round"] = rnd
                collected.setdefault((model, mode), []).append(res)
                print(json.dumps(res), flush=True)
    summary = {key: summarize(v) for key, v in collected.items()}

    print()
    r = args.ranks
    head = (f"{'model':8} {'single/s':>10} {f'DDP {r}r/s':>10} {f'hvdlite {r}r/s':>13} "
            f"{'hvdlite/DDP':>12} {'eff DDP':>8} {'eff hvdlite':>12} {'paired: hvd/DDP':>16} "
            f"{'eff hvd':>8} {'ceiling':>8} {'hvd/ceiling':>12}")
    print(head)
    print("-" * len(head))
    table = []
    for model in models:
        s = summary[(model, "single")]["samples_per_s"]
        d = summary[(model, "ddp")]["samples_per_s"]
        h = summary[(model, "hvdlite")]["samples_per_s"]
        row = {"model": model, "single": s, "ddp": d, "hvdlite": h, "hvdlite_over_ddp": h / d,
               **({"hosts": HOSTS.host_spec(LAYOUT), "rate": args.rate} if HOSTS is not None else {}),
               "efficiency_ddp": d / (args.ranks * s), "efficiency_hvdlite": h / (args.ranks * s)}
        # Paired: the ratios within each round (run back to back), then their median;
        # steadier than the ratio of medians when the machine's speed drifts.
        per_round = list(zip(*(collected[(model, m)] for m in ("single", "ddp", "hvdlite"))))
        paired = [hv["samples_per_s"] / dd["samples_per_s"] for _, dd, hv in per_round]
        row["paired_hvdlite_over_ddp"] = statistics.median(paired)
        row["paired_hvdlite_over_ddp_range"] = [min(paired), max(paired)]
        row["rounds"] = len(per_round)
        for m in ("single", "ddp", "hvdlite", "independent"):
            row[f"{m}_spread"] = summary[(model, m)]["spread"]
        row["paired_efficiency_hvdlite"] = statistics.median(
            hv["samples_per_s"] / (args.ranks * si["samples_per_s"]) for si, _, hv in per_round)
        # The ceiling: independent processes with no communication, as an efficiency.
        ind = collected[(model, "independent")]
        row["efficiency_ceiling"] = statistics.median(
            i["samples_per_s"] / (args.ranks * si["samples_per_s"])
            for i, si in zip(ind, collected[(model, "single")]))
        row["paired_hvdlite_over_ceiling"] = statistics.median(
            hv["samples_per_s"] / i["samples_per_s"]
            for i, hv in zip(ind, collected[(model, "hvdlite")]))
        table.append(row)
        print(f"{model:8} {s:10.1f} {d:10.1f} {h:13.1f} {row['hvdlite_over_ddp']:12.3f} "
              f"{row['efficiency_ddp']:8.3f} {row['efficiency_hvdlite']:12.3f} "
              f"{row['paired_hvdlite_over_ddp']:16.3f} {row['paired_efficiency_hvdlite']:8.3f} "
              f"{row['efficiency_ceiling']:8.3f} {row['paired_hvdlite_over_ceiling']:12.3f}")
        print(json.dumps({"summary": row}), flush=True)
    print(f"\n(samples/s over all ranks, median of {args.rounds} round(s) x {args.windows} "
          f"windows of {args.steps} steps; 1 thread per process; efficiency = {r}-rank / "
          f"({r} x single))")
    if HOSTS is not None:
        print(f"(ddp and hvdlite on {args.hosts} emulated hosts, {HOSTS.host_spec(LAYOUT)}, links "
              f"{args.rate}; every host shares this machine's cores)")
    runs = [r for v in collected.values() for r in v]
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"runs": runs, "summary": table}, indent=1))
    run.write(results_path(args, "bench_torch_training", args.quick), runs, table,
              {k: v for k, v in vars(args).items() if not k.startswith(("worker", "ddp_"))}, args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
