"""ZeRO-Offload's CPU step: PyTorch's Adam implementations on a shard in host memory,
side by side, each followed by the cast of the updated shard to bf16 (what goes back
to the GPU for 16-bit parameters).

    python benchmarks/bench_offload_step.py [--elements 25000000] [--tensors 20]
                                            [--repeats 7] [--threads 0] [--results PATH]

``ZeroRedundancyOptimizer(offload_optimizer="cpu")`` steps its shard with the fastest
CPU step the installed PyTorch offers; this measures them: ``fused`` (one kernel over
all tensors), ``foreach`` (multi-tensor ops) and ``single`` (a loop over tensors), on
``--elements`` float32 elements split into ``--tensors`` pieces (the pieces of one
rank's shard), with gradients set. A figure is the median of ``--repeats`` timed steps
after one untimed. The report gives each one's time and the ratio to ``fused``.
``--threads`` sets ``torch.set_num_threads`` (0: PyTorch's default).

The results file (``benchmarks/_common.py``) goes to
``benchmarks/results/bench_offload_step.json`` by default.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ResultsRun, add_results_options, results_path  # noqa: E402

KINDS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "single": {"foreach": False}}


def time_step(kind: str, elements: int, tensors: int, repeats: int) -> float:
    import torch
    g = torch.Generator().manual_seed(0)
    size = elements // tensors
    params = [torch.randn(size, generator=g).requires_grad_(True) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(size, generator=g)
    out = [torch.empty(size, dtype=torch.bfloat16) for _ in range(tensors)]
    opt = torch.optim.Adam(params, lr=1e-3, **KINDS[kind])
    times = []
    for i in range(repeats + 1):
        t = time.perf_counter()
        opt.step()
        for p, o in zip(params, out):
            o.copy_(p.detach())
        if i:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    import torch
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elements", type=int, default=25_000_000)
    p.add_argument("--tensors", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=0)
    add_results_options(p, "bench_offload_step")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    run = ResultsRun("bench_offload_step")
    seconds = {k: time_step(k, args.elements, args.tensors, args.repeats) for k in KINDS}
    print(f"\nAdam step plus cast to bf16, {args.elements / 1e6:g} M float32 elements in {args.tensors} tensors, "
          f"{torch.get_num_threads()} threads, PyTorch {torch.__version__}\n")
    print("| step | ms | ÷ fused |")
    print("| --- | --- | --- |")
    summary = []
    for k, s in seconds.items():
        print(f"| {k} | {1e3 * s:.1f} | {s / seconds['fused']:.2f} |")
        summary.append({"kind": k, "ms": round(1e3 * s, 2), "over_fused": round(s / seconds["fused"], 3)})
    print()
    run.write(results_path(args, "bench_offload_step"), summary, summary,
              {**vars(args), "torch_threads": torch.get_num_threads()}, args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
