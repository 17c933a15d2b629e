"""Allreduce or allgather across emulated hosts: hvdlite's flat and two-level algorithms
and its default choice against Open MPI's own collective, side by side in the same
processes.

    python benchmarks/bench_hosts.py [--op allreduce|allgather]
                                     [--configs 2x2@1gbit,4x1@10gbit,...]
                                     [--sizes 4K,1M,64M] [--rounds 5] [--json-out F.json]
                                     [--results PATH]

Needs root: each configuration ``HxG@RATE`` builds H emulated hosts (network
namespaces joined by a bridge, every host's link limited to RATE in each direction by
tc; ``tests/hosts/emulated.py``) and launches H*G ranks on them with ``hvdlite-run -H``.

Algorithms (each needs its own ``init()``, since rank 0's settings are fixed there):

- allreduce: ``flat`` (``HOROVOD_HIERARCHICAL_ALLREDUCE=0``), ``two-level`` (``=1``, the
  torus schedule), ``leader`` (``=1`` and ``HVDLITE_HIERARCHICAL_ALGORITHM=leader``),
  ``default`` (both unset);
- allgather: ``flat`` (``HOROVOD_HIERARCHICAL_ALLGATHER=0``), ``two-level`` (``=1``),
  ``default`` (unset).

The machine is shared and its speed drifts, so the algorithms are interleaved: the job
runs ``--rounds`` rounds, and every round runs every algorithm (``init()``, every size,
``shutdown()``), starting each round at the next algorithm. Inside an algorithm's turn,
each repetition times hvdlite and mpi4py's ``MPI_Allreduce`` / ``MPI_Allgather`` on the
same data (the MPI column pools these from every turn), each going first by turns: where
the emulated links' token buckets run dry during a size, the first op of a repetition
finds tokens the second does not. Each op starts after a barrier and is timed by rank
0. A figure is the median over rounds of each round's median; ``spread`` in the JSON is
the largest round median over the smallest.

The link floor is what each host must move over its link, at the link's rate: for an
allreduce of S bytes over H hosts 2(H-1)/H * S sent, for an allgather of S bytes in all
(S/n from each rank) (H-1)/H * S received.

The results file (``benchmarks/_common.py``: command, machine, date, commit, every row)
goes to ``benchmarks/results/bench_hosts.json`` by default
(``bench_hosts_allgather.json`` for ``--op allgather``).
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ResultsRun, add_results_options, results_path  # noqa: E402  (sibling module)
# Per operation: algorithm -> the variables it sets (None: unset).
ALGORITHMS: dict[str, dict[str, dict[str, str | None]]] = {
    "allreduce": {
        "flat": {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0", "HVDLITE_HIERARCHICAL_ALGORITHM": None},
        "two-level": {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HVDLITE_HIERARCHICAL_ALGORITHM": "torus"},
        "leader": {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HVDLITE_HIERARCHICAL_ALGORITHM": "leader"},
        "default": {"HOROVOD_HIERARCHICAL_ALLREDUCE": None, "HVDLITE_HIERARCHICAL_ALGORITHM": None},
    },
    "allgather": {
        "flat": {"HOROVOD_HIERARCHICAL_ALLGATHER": "0"},
        "two-level": {"HOROVOD_HIERARCHICAL_ALLGATHER": "1"},
        "default": {"HOROVOD_HIERARCHICAL_ALLGATHER": None},
    },
}
DEFAULT_SIZES = "4K,64K,1M,4M,16M,64M"
DEFAULT_CONFIGS = "2x2@1gbit"


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def size_label(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return f"{n} B"


def time_label(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.1f} ms"
    return f"{t * 1e6:.0f} µs"


def rate_bytes(rate: str) -> float:
    sys.path.insert(0, str(REPO))
    from tests.hosts.emulated import _rate_bytes
    return _rate_bytes(rate)


# ---------------------------------------------------------------- inside the job
def worker(args: argparse.Namespace) -> None:
    import numpy as np
    from mpi4py import MPI

    import hvdlite as hvd

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    algos = ALGORITHMS[args.op]
    names = list(algos)
    # samples[algo][size][round] -> times of that round
    samples: dict[str, dict[int, list[list[float]]]] = {
        a: {s: [[] for _ in range(args.rounds)] for s in sizes} for a in names + ["mpi"]}
    if args.op == "allreduce":
        buffers = {s: np.ones(s // 4, np.float32) for s in sizes}
    else:  # each rank's part of an allgather of s bytes in all, and MPI's result buffer
        buffers = {s: np.full(max(1, s // 4 // n), comm.Get_rank(), np.float32) for s in sizes}
        results = {s: np.empty(n * buffers[s].size, np.float32) for s in sizes}

    def run_hvd(s: int) -> None:
        if args.op == "allreduce":
            hvd.allreduce_(buffers[s], op=hvd.Sum, name=f"bench.{s}")
        else:
            hvd.allgather(buffers[s], name=f"bench.{s}")

    def run_mpi(s: int) -> None:
        if args.op == "allreduce":
            comm.Allreduce(MPI.IN_PLACE, buffers[s], op=MPI.SUM)
        else:
            comm.Allgather(buffers[s], results[s])

    def timed(fn, s: int) -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        fn(s)
        return time.perf_counter() - t0

    for rnd in range(args.rounds):
        for k in range(len(names)):
            algo = names[(rnd + k) % len(names)]
            for var, value in algos[algo].items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
            hvd.init()
            for s in sizes:
                reps = max(args.min_reps, min(args.max_reps, int(args.budget_bytes / s / args.rounds)))
                # Every size starts with the links' token buckets full (tests/hosts/emulated.py
                # sizes them to 10 ms at the link's rate), whatever the size before it moved.
                comm.Barrier()
                time.sleep(args.refill)
                for rep in range(reps + args.warmup):
                    # The two go first by turns: where the token bucket runs dry during a
                    # size, the op that comes first finds the tokens the other does not.
                    if rep % 2 == 0:
                        t_h, t_m = timed(run_hvd, s), timed(run_mpi, s)
                    else:
                        t_m, t_h = timed(run_mpi, s), timed(run_hvd, s)
                    if args.op == "allreduce":
                        buffers[s].fill(1.0)  # keep the values finite
                    if rep >= args.warmup:  # the first warm the connections and pages
                        samples[algo][s][rnd].append(t_h)
                        samples["mpi"][s][rnd].append(t_m)
            hvd.shutdown()
    if comm.Get_rank() == 0:
        out = {}
        for a, by in samples.items():
            out[a] = {}
            for s, rounds in by.items():
                per_round = [statistics.median(r) for r in rounds if r]
                out[a][s] = {"median": statistics.median(per_round),
                             "spread": max(per_round) / min(per_round), "rounds": per_round}
        print("RESULT " + json.dumps(out), flush=True)


# ---------------------------------------------------------------- driver
def run_config(config: str, args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(REPO))
    from tests.hosts.emulated import EmulatedHosts

    shape, rate = config.split("@")
    hosts_n, per_host = (int(v) for v in shape.lower().split("x"))
    with EmulatedHosts(hosts_n, rate) as hosts:
        env = dict(os.environ, **hosts.env(), PYTHONPATH=str(REPO), HVDLITE_LOG_LEVEL="error")
        for algo in ALGORITHMS[args.op].values():
            for var in algo:
                env.pop(var, None)
        cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(hosts_n * per_host),
               "-H", hosts.host_spec(per_host), sys.executable, str(Path(__file__).resolve()),
               "--worker", "--op", args.op, "--sizes", args.sizes, "--rounds", str(args.rounds),
               "--min-reps", str(args.min_reps), "--max-reps", str(args.max_reps),
               "--warmup", str(args.warmup), "--budget-bytes", str(args.budget_bytes), "--refill", str(args.refill)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{config}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    med = {a: {int(s): v for s, v in by.items()} for a, by in json.loads(lines[0][7:]).items()}
    if args.op == "allreduce":
        floor_per_byte = 2 * (hosts_n - 1) / hosts_n / rate_bytes(rate) if hosts_n > 1 else 0.0
    else:
        floor_per_byte = (hosts_n - 1) / hosts_n / rate_bytes(rate) if hosts_n > 1 else 0.0
    rows = []
    for s in sorted(med["mpi"]):
        t = {a: med[a][s]["median"] for a in med}
        floor = s * floor_per_byte
        row = {"op": args.op, "config": config, "bytes": s, "rounds": args.rounds, "floor_s": floor,
               "order": "alternating"}  # hvdlite's op and MPI's go first by turns
        for a in med:
            row[f"{a}_s"] = t[a]
            row[f"{a}_spread"] = med[a][s]["spread"]
        best = min(t["flat"], t["two-level"])
        row["default_over_best"] = t["default"] / best
        row["default_over_mpi"] = t["default"] / t["mpi"]
        row["two_level_over_flat"] = t["two-level"] / t["flat"]
        row["two_level_over_floor"] = t["two-level"] / floor if floor else None
        if "leader" in t:
            row["leader_over_two_level"] = t["leader"] / t["two-level"]
        rows.append(row)
    return {"op": args.op, "config": config, "rows": rows}


def print_table(result: dict) -> None:
    """The results of one configuration as a Markdown table."""
    rows = result["rows"]
    algos = [a for a in ("flat", "two-level", "leader", "default", "mpi") if f"{a}_s" in rows[0]]
    mpi_name = "MPI_Allreduce" if result["op"] == "allreduce" else "MPI_Allgather"
    cols = ["size"] + [mpi_name if a == "mpi" else a for a in algos] + ["link floor", "default ÷ better",
                                                                         "default ÷ MPI", "two-level ÷ flat",
                                                                         "two-level ÷ floor"]
    if "leader" in algos:
        cols.append("leader ÷ two-level")
    print(f"\n{result['op']}, {result['config']} (median of {rows[0]['rounds']} rounds' medians)\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + " --- |" * len(cols))
    for r in rows:
        cells = [size_label(r["bytes"])] + [time_label(r[f"{a}_s"]) for a in algos]
        cells += [time_label(r["floor_s"]) if r["floor_s"] else "–", f"{r['default_over_best']:.3f}",
                  f"{r['default_over_mpi']:.3f}", f"{r['two_level_over_flat']:.3f}",
                  f"{r['two_level_over_floor']:.3f}" if r["two_level_over_floor"] else "–"]
        if "leader" in algos:
            cells.append(f"{r['leader_over_two_level']:.3f}")
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", choices=sorted(ALGORITHMS), default="allreduce")
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help="HOSTSxRANKS@RATE,... e.g. 2x2@1gbit,4x1@10gbit")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help="bytes reduced, or gathered in all (each rank sends its share)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of every algorithm in turn")
    p.add_argument("--warmup", type=int, default=1, help="untimed repetitions per size in each turn")
    p.add_argument("--min-reps", type=int, default=2, help="timed repetitions per size per turn, at least")
    p.add_argument("--max-reps", type=int, default=20, help="and at most")
    p.add_argument("--budget-bytes", type=float, default=512 << 20,
                   help="timed repetitions per size: about this many bytes over all rounds")
    p.add_argument("--refill", type=float, default=0.05,
                   help="seconds idle before each size, so that it starts with the token buckets full")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--json-out", default="")
    add_results_options(p, "bench_hosts")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    run = ResultsRun("bench_hosts")
    sys.path.insert(0, str(REPO))
    from tests.hosts.emulated import unavailable
    reason = unavailable()
    if reason:
        print(f"bench_hosts: {reason}", file=sys.stderr)
        return 2
    results = []
    for config in args.configs.split(","):
        result = run_config(config, args)
        print_table(result)
        for row in result["rows"]:
            print(json.dumps(row), flush=True)
        results.append(result)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
    name = "bench_hosts" if args.op == "allreduce" else f"bench_hosts_{args.op}"
    rows = [row for result in results for row in result["rows"]]
    ratios = ("default_over_mpi", "default_over_best", "two_level_over_flat", "two_level_over_floor",
              "leader_over_two_level")
    summary = [{"op": r["op"], "config": r["config"], "bytes": r["bytes"],
                **{k: r[k] for k in ratios if k in r}} for r in rows]
    run.write(results_path(args, name), rows, summary,
              {k: v for k, v in vars(args).items() if k != "worker"}, args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
