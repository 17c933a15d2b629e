"""1-bit Adam against Adam through DistributedOptimizer, on emulated hosts joined by a
slow link, side by side in one job.

    python benchmarks/bench_onebit.py [--hosts 2] [--rate 100mbit] [--steps 50]
                                      [--warmup-fraction 0.2] [--rounds 1] [--quick]
                                      [--json-out F] [--results PATH]

Needs root for ``--hosts`` (network namespaces, ``tests/hosts/emulated.py``); with
``--hosts 0`` both run on this host. One rank per host, launched with
``hvdlite-run -H h1:1,h2:1``. The model is an MLP of 4.2 M float32 parameters
(1024 -> 2048 -> 1024 -> 10) learning a fixed random teacher's labels (batch 64 per
rank, synthetic, different on each rank, the same for both optimizers). Each round
trains it from the same start ``--steps`` steps with:

* ``adam``: ``torch.optim.Adam`` in ``hvdlite.torch.DistributedOptimizer``;
* ``onebit``: ``hvdlite.torch.OneBitAdam`` with ``freeze_step`` = the warm-up fraction
  of the steps (uncompressed Adam), then 1-bit compressed momentum;
* ``topk``: Adam in ``DistributedOptimizer`` with ``Compression.topk(--topk-ratio)``
  (error feedback; ``--topk-ratio 0`` leaves it out).

Reported: steps per second over the whole run (warm-up included), their ratio, each
run's final loss (mean of the last 10 % of steps) and its ratio, and the bytes each rank
sent per step (OneBitAdam counts its own; the allreduce sends 2(N-1)/N of the
gradients).

The results file (``benchmarks/_common.py``: command, machine, date, commit, every run)
goes to ``benchmarks/results/bench_onebit.json`` by default; ``--quick`` writes none
unless ``--results PATH`` is given.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (REPO, ResultsRun, add_results_options, launcher, results_path,  # noqa: E402
                     run_job_for_result, start_hosts)

BATCH = 64


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    torch.manual_seed(1234)
    teacher = torch.nn.Sequential(torch.nn.Linear(1024, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
    g = torch.Generator().manual_seed(rank)
    data = []
    with torch.no_grad():
        for _ in range(args.steps):
            x = torch.randn(BATCH, 1024, generator=g)
            data.append((x, teacher(x).argmax(1)))

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(),
                                   torch.nn.Linear(2048, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))

    def run(kind: str) -> dict[str, Any]:
        m = model()
        if kind == "adam":
            opt: Any = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters(), lr=args.lr),
                                                named_parameters=m.named_parameters())
        elif kind == "topk":
            comp = hvd.Compression.topk(args.topk_ratio)
            opt = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters(), lr=args.lr),
                                           named_parameters=m.named_parameters(), compression=comp)
        else:
            opt = hvd.OneBitAdam(m.parameters(), lr=args.lr,
                                 freeze_step=int(args.warmup_fraction * args.steps))
        losses = []
        hvd.barrier()
        t0 = time.perf_counter()
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        elapsed = float(hvd.allreduce(torch.tensor([time.perf_counter() - t0]), op=hvd.Max,
                                      name="bench.onebit.time").item())
        tail = max(1, len(losses) // 10)
        final = float(hvd.allreduce(torch.tensor([statistics.mean(losses[-tail:])]),
                                    name="bench.onebit.loss").item())
        params = sum(p.numel() for p in m.parameters())
        if kind == "onebit":
            sent = opt.sent_bytes / len(data)
        elif kind == "topk":
            sent = sum(comp.bytes_sent(p.numel(), 4, n) for p in m.parameters())
        else:
            sent = 2 * (n - 1) / n * params * 4
        return {"steps_per_s": len(data) / elapsed, "final_loss": final, "first_loss": losses[0],
                "bytes_per_step": sent, "parameters": params}

    kinds = ["adam", "onebit"] + (["topk"] if args.topk_ratio > 0 else [])
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for rnd in range(args.rounds):
        for j in range(len(kinds)):
            kind = kinds[(rnd + j) % len(kinds)]
            results[kind].append(run(kind))
    if rank == 0:
        print("ONEBIT_RESULT " + json.dumps(results), flush=True)
    hvd.shutdown()


def report(res: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    speed = [o["steps_per_s"] / a["steps_per_s"] for a, o in zip(res["adam"], res["onebit"])]
    loss = [o["final_loss"] / a["final_loss"] for a, o in zip(res["adam"], res["onebit"])]
    where = f"{args.hosts} emulated hosts at {args.rate}" if args.hosts else "this host"
    print(f"\n1-bit Adam, {args.hosts or 2} ranks on {where}, {res['adam'][0]['parameters'] / 1e6:.2f} M "
          f"parameters, {args.steps} steps, warm-up {args.warmup_fraction:.0%}, {args.rounds} round(s)\n")
    print("| optimizer | steps/s | final loss (first) | bytes sent per rank per step |")
    print("| --- | --- | --- | --- |")
    for kind in res:
        r = res[kind]
        speeds = ", ".join(f"{x['steps_per_s']:.3f}" for x in r)
        losses = ", ".join(f"{x['final_loss']:.4f} ({x['first_loss']:.3f})" for x in r)
        sent = statistics.median(x["bytes_per_step"] for x in r) / 2**20
        print(f"| {kind} | {speeds} | {losses} | {sent:.2f} MiB |")
    print(f"\nonebit ÷ adam, steps/s: {', '.join(f'{x:.2f}' for x in speed)}; final loss: "
          f"{', '.join(f'{x:.3f}' for x in loss)}")
    out = {"hosts": args.hosts, "rate": args.rate, "steps": args.steps, "warmup_fraction": args.warmup_fraction,
           "speed_ratio": speed, "loss_ratio": loss, "results": res}
    if "topk" in res:
        out["topk_speed_ratio"] = [t["steps_per_s"] / a["steps_per_s"] for a, t in zip(res["adam"], res["topk"])]
        out["topk_loss_ratio"] = [t["final_loss"] / a["final_loss"] for a, t in zip(res["adam"], res["topk"])]
        print(f"topk({args.topk_ratio}) ÷ adam, steps/s: {', '.join(f'{x:.2f}' for x in out['topk_speed_ratio'])}; "
              f"final loss: {', '.join(f'{x:.3f}' for x in out['topk_loss_ratio'])}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts, one rank each (0: 2 ranks here)")
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup-fraction", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--topk-ratio", type=float, default=0.01,
                   help="also run Adam in DistributedOptimizer with Compression.topk(ratio); 0: not")
    p.add_argument("--quick", action="store_true", help="10 steps, no hosts: checks that it runs")
    p.add_argument("--json-out", default="")
    add_results_options(p, "bench_onebit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.hosts = 10, 0
    if args.worker:
        worker(args)
        return 0
    tail = [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps),
            "--warmup-fraction", str(args.warmup_fraction), "--lr", str(args.lr), "--rounds", str(args.rounds),
            "--topk-ratio", str(args.topk_ratio)]
    env = {"PYTHONPATH": str(REPO)}
    run = ResultsRun("bench_onebit")
    if args.hosts:
        with start_hosts(args.hosts, args.rate) as hosts:
            cmd = launcher(args.hosts) + ["-H", hosts.host_spec(1)] + tail
            res = run_job_for_result(cmd, {**os.environ, **env, **hosts.env()}, "ONEBIT_RESULT")
    else:
        res = run_job_for_result(launcher(2) + tail, {**os.environ, **env}, "ONEBIT_RESULT")
    if res is None:
        return 1
    out = report(res, args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    rows = [{"optimizer": kind, "round": i, **r} for kind, runs in res.items() for i, r in enumerate(runs)]
    summary = []
    for kind, runs in res.items():
        entry = {"optimizer": kind,
                 "steps_per_s": statistics.median(r["steps_per_s"] for r in runs),
                 "steps_per_s_range": [min(r["steps_per_s"] for r in runs), max(r["steps_per_s"] for r in runs)],
                 "final_loss": statistics.median(r["final_loss"] for r in runs),
                 "first_loss": runs[0]["first_loss"],
                 "bytes_per_step": statistics.median(r["bytes_per_step"] for r in runs),
                 "parameters": runs[0]["parameters"], "rounds": len(runs)}
        if kind != "adam":
            speed = [o["steps_per_s"] / a["steps_per_s"] for a, o in zip(res["adam"], runs)]
            loss = [o["final_loss"] / a["final_loss"] for a, o in zip(res["adam"], runs)]
            entry.update({"speed_over_adam": statistics.median(speed), "speed_over_adam_range": [min(speed), max(speed)],
                          "loss_over_adam": statistics.median(loss)})
        summary.append(entry)
    run.write(results_path(args, "bench_onebit", args.quick), rows, summary,
              {k: v for k, v in vars(args).items() if k != "worker"}, args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
