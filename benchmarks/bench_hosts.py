"""Allreduce across emulated hosts: hvdlite flat, hierarchical and default against Open
MPI's own MPI_Allreduce, side by side in the same processes.

    python benchmarks/bench_hosts.py [--configs 2x2@1gbit,4x1@10gbit,...]
                                     [--sizes 4K,1M,64M] [--json-out F.json]

Needs root: each configuration ``HxG@RATE`` builds H emulated hosts (network
namespaces joined by a bridge, every host's link limited to RATE in each direction by
tc; ``tests/hosts/emulated.py``) and launches H*G ranks on them with ``hvdlite-run -H``.
Inside that one job every rank times, for each message size, hvdlite's allreduce with
``HOROVOD_HIERARCHICAL_ALLREDUCE=0`` (flat ring or MPI_Allreduce, as on one host), ``=1``
(two-level) and unset (hvdlite's default choice), restarting hvdlite (``shutdown()``,
``init()``) between them, and mpi4py's ``MPI_Allreduce`` on the same buffer in between.
Each figure is the median over repetitions that all ranks start together (after a
barrier), as seen by rank 0. The link floor is what each host must send over its link
for an allreduce of S bytes over H hosts, 2(H-1)/H * S, at the link's rate.
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
MODES = {"flat": "0", "hierarchical": "1", "default": None}
DEFAULT_SIZES = "4K,64K,1M,4M,16M,64M,256M"
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
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results: dict[str, dict[int, list[float]]] = {m: {} for m in list(MODES) + ["mpi"]}
    buffers = {s: np.ones(s // 4, np.float32) for s in sizes}
    for mode, value in MODES.items():
        if value is None:
            os.environ.pop("HOROVOD_HIERARCHICAL_ALLREDUCE", None)
        else:
            os.environ["HOROVOD_HIERARCHICAL_ALLREDUCE"] = value
        hvd.init()
        for s in sizes:
            x = buffers[s]
            reps = max(3, min(args.max_reps, int(args.budget_bytes / s)))
            for rep in range(reps + 2):
                comm.Barrier()
                t0 = time.perf_counter()
                hvd.allreduce_(x, op=hvd.Sum, name=f"bench.{s}")
                t_h = time.perf_counter() - t0
                comm.Barrier()
                t0 = time.perf_counter()
                comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
                t_m = time.perf_counter() - t0
                x.fill(1.0)  # keep the values finite
                if rep >= 2:  # the first two warm the connections and pages
                    results[mode].setdefault(s, []).append(t_h)
                    results["mpi"].setdefault(s, []).append(t_m)
        hvd.shutdown()
    if comm.Get_rank() == 0:
        med = {m: {s: statistics.median(v) for s, v in by.items()} for m, by in results.items()}
        print("RESULT " + json.dumps(med), flush=True)


# ---------------------------------------------------------------- driver
def run_config(config: str, args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(REPO))
    from tests.hosts.emulated import EmulatedHosts

    shape, rate = config.split("@")
    hosts_n, per_host = (int(v) for v in shape.lower().split("x"))
    with EmulatedHosts(hosts_n, rate) as hosts:
        env = dict(os.environ, **hosts.env(), PYTHONPATH=str(REPO), HVDLITE_LOG_LEVEL="error")
        env.pop("HOROVOD_HIERARCHICAL_ALLREDUCE", None)
        cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(hosts_n * per_host),
               "-H", hosts.host_spec(per_host), sys.executable, str(Path(__file__).resolve()),
               "--worker", "--sizes", args.sizes, "--max-reps", str(args.max_reps),
               "--budget-bytes", str(args.budget_bytes)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{config}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    med = {m: {int(s): t for s, t in by.items()} for m, by in json.loads(lines[0][7:]).items()}
    floor_per_byte = 2 * (hosts_n - 1) / hosts_n / rate_bytes(rate) if hosts_n > 1 else 0.0
    rows = []
    for s in sorted(med["mpi"]):
        f, h, d, m = (med[k][s] for k in ("flat", "hierarchical", "default", "mpi"))
        floor = s * floor_per_byte
        rows.append({"config": config, "bytes": s, "flat_s": f, "hierarchical_s": h, "default_s": d,
                     "mpi_s": m, "floor_s": floor, "default_over_best": d / min(f, h),
                     "default_over_mpi": d / m, "hierarchical_over_mpi": h / m,
                     "hierarchical_over_floor": h / floor if floor else None,
                     "flat_over_floor": f / floor if floor else None})
    return {"config": config, "rows": rows}


def print_table(result: dict) -> None:
    print(f"\n{result['config']}  (medians, seconds; ratios: lower is better)")
    head = (f"{'size':>9} {'flat':>9} {'hier':>9} {'default':>9} {'MPI':>9} {'floor':>9} "
            f"{'dflt/best':>10} {'dflt/MPI':>9} {'hier/MPI':>9} {'hier/floor':>11}")
    print(head)
    print("-" * len(head))
    for r in result["rows"]:
        hf = f"{r['hierarchical_over_floor']:11.3f}" if r["hierarchical_over_floor"] else f"{'-':>11}"
        print(f"{size_label(r['bytes']):>9} {r['flat_s']:9.5f} {r['hierarchical_s']:9.5f} "
              f"{r['default_s']:9.5f} {r['mpi_s']:9.5f} {r['floor_s']:9.5f} "
              f"{r['default_over_best']:10.3f} {r['default_over_mpi']:9.3f} "
              f"{r['hierarchical_over_mpi']:9.3f} {hf}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help="HOSTSxRANKS@RATE,... e.g. 2x2@1gbit,4x1@10gbit")
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--max-reps", type=int, default=20)
    p.add_argument("--budget-bytes", type=float, default=512 << 20,
                   help="repetitions per size: about this many bytes (3 at least)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--json-out", default="")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
