"""Memory per rank of ZeRO stages 1, 2 and 3 against replicated Adam and PyTorch's ZeRO,
side by side, on a model dominated by one matrix (a tied embedding) and on one of equal
layers.

    python benchmarks/bench_zero_memory.py [--ranks 2 4] [--steps 3] [--results PATH]

Run it with plain ``python``: it launches itself with ``hvdlite-run -np RANKS``, once for
each number of ranks. Every
rank also joins a ``torch.distributed`` gloo group (rendezvous on this host) for
PyTorch's ZeRO. In the same processes, in turn, for each model:

* ``replicated``: ``hvdlite.torch.DistributedOptimizer(Adam)``, the whole state on
  every rank;
* ``torch_zero``: PyTorch's ``ZeroRedundancyOptimizer(optimizer_class=Adam)`` (whole
  parameters per rank, largest first to the least loaded), gradients averaged with one
  gloo ``all_reduce`` each;
* ``stage1``, ``stage2``, ``stage3``: ``hvdlite.torch.ZeroRedundancyOptimizer(Adam)`` at
  that stage (``model=`` at stage 3).

What is counted: the bytes of the distinct tensor storages a rank holds for training,
each storage once however many views it has: the model's parameters and their
``.grad``, the optimizer's state (for the ZeRO optimizers their local optimizer's), and
hvdlite ZeRO's shards (master weights and gradient shards). Engine buffers (fusion,
gloo, in-flight collectives) and activations are not counted. Each rank measures after
backward (before ``step()``) and after ``step()`` of ``--steps`` steps; its figure is the
larger. The report gives, per model and configuration, the largest rank's bytes over
``replicated``'s, with ``1/N`` of replicated Adam as the floor of full sharding. It also
gives the peak during forward and backward: the same count taken after each module's
forward and as each gradient is accumulated (at stage 3 it includes the parameters
gathered for the modules running then), largest rank over replicated's final figure.

Models: ``tied``, an embedding of 4096 x 256 tied to the output layer and three 256 x 256
layers (the embedding is 84 % of the parameters); ``mlp``, eight 512 x 512 layers. Data
are random token ids or vectors, batch 16 per rank.

The results file (``benchmarks/_common.py``) goes to
``benchmarks/results/bench_zero_memory.json`` by default.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (REPO, ResultsRun, add_results_options, free_port, results_path,  # noqa: E402
                     run_job_for_result)

CONFIGS = ["replicated", "torch_zero", "stage1", "stage2", "stage3"]
MODELS = ["tied", "mlp"]
BATCH = 16
VOCAB = 4096


# ---------------------------------------------------------------- inside the job
def make_model(name: str) -> Any:
    import torch

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, 256)
            self.body = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                                            torch.nn.Tanh(), torch.nn.Linear(256, 256))
            self.head = torch.nn.Linear(256, VOCAB, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x: Any) -> Any:
            return self.head(self.body(self.emb(x)))

    torch.manual_seed(0)
    if name == "tied":
        return Tied()
    layers: list[Any] = []
    for _ in range(8):
        layers += [torch.nn.Linear(512, 512), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def batch(name: str, rank: int, step: int) -> tuple[Any, Any]:
    import torch
    g = torch.Generator().manual_seed(1000 * rank + step)
    if name == "tied":
        x = torch.randint(0, VOCAB, (BATCH,), generator=g)
        return x, torch.randint(0, VOCAB, (BATCH,), generator=g)
    return torch.randn(BATCH, 512, generator=g), torch.randn(BATCH, 512, generator=g)


def loss_of(name: str, out: Any, y: Any) -> Any:
    import torch.nn.functional as F
    return F.cross_entropy(out, y) if name == "tied" else F.mse_loss(out, y)


def held_bytes(model: Any, opt: Any) -> int:
    """Bytes of the distinct storages held for training (see the module's docstring)."""
    import torch
    tensors: list[Any] = []
    for p in model.parameters():
        tensors += [p, p.grad]
    local = getattr(opt, "optim", None)
    states = [opt] + ([local] if local is not None else [])
    for o in states:
        for st in o.state.values():
            tensors += [v for v in st.values() if isinstance(v, torch.Tensor)]
    for fs in getattr(opt, "_flats", []) if local is not None else []:
        for f in fs:
            tensors += [f.master, f.grad] + [t for piece in f.pieces for t in (piece.tensor.grad, piece.grad)]
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def measure(name: str, config: str, steps: int) -> tuple[int, int]:
    """(most bytes after backward or step, most bytes during forward and backward)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

    import hvdlite.torch as hvd

    model = make_model(name)
    if config == "replicated":
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3),
                                       named_parameters=model.named_parameters())
    elif config == "torch_zero":
        opt = TorchZero(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        stage = int(config[-1])
        opt = hvd.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3,
                                          stage=stage, **({"model": model} if stage == 3 else {}))
    most = peak = 0

    def sample(*_: Any) -> None:
        nonlocal peak
        peak = max(peak, held_bytes(model, opt))

    for m in model.modules():
        m.register_forward_hook(sample)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(sample)
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(name, hvd.rank(), step)
        loss_of(name, model(x), y).backward()
        if config == "torch_zero":
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad.div_(hvd.size())
        most = max(most, held_bytes(model, opt))
        opt.step()
        most = max(most, held_bytes(model, opt))
    return most, max(peak, most)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=hvd.rank(),
                            world_size=hvd.size())
    result: dict[str, Any] = {"ranks": hvd.size(), "bytes": {}, "peak": {}, "params": {}, "largest": {}}
    for name in MODELS:
        params = [p.numel() for p in make_model(name).parameters()]
        result["params"][name] = sum(params)
        result["largest"][name] = max(params) / sum(params)
        for config in CONFIGS:
            mine, peak = measure(name, config, args.steps)
            result["bytes"][f"{name}/{config}"] = hvd.allgather_object(mine)
            result["peak"][f"{name}/{config}"] = hvd.allgather_object(peak)
    if hvd.rank() == 0:
        import json
        print("ZERO_MEMORY " + json.dumps(result), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------- the report
def report(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Print the table of one job (``res``, one number of ranks); its summary rows."""
    n = res["ranks"]
    summary = []
    print(f"\nlargest rank's training bytes over replicated Adam's, {n} ranks (full sharding: {1 / n:.3f});"
          f" in brackets the peak during forward and backward\n")
    print("| model | parameters | largest parameter | " + " | ".join(CONFIGS) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in CONFIGS) + " |")
    for name in MODELS:
        base = max(res["bytes"][f"{name}/replicated"])
        cells = []
        for config in CONFIGS:
            per_rank = res["bytes"][f"{name}/{config}"]
            peak = max(res["peak"][f"{name}/{config}"])
            ratio = max(per_rank) / base
            cells.append(f"{ratio:.3f} ({peak / base:.3f})")
            summary.append({"ranks": n, "model": name, "config": config, "largest_rank_bytes": max(per_rank),
                            "smallest_rank_bytes": min(per_rank), "over_replicated": round(ratio, 4),
                            "peak_bytes": peak, "peak_over_replicated": round(peak / base, 4),
                            "largest_parameter_share": round(res["largest"][name], 4)})
        print(f"| {name} | {res['params'][name] / 1e6:.2f} M | {res['largest'][name]:.0%} | "
              + " | ".join(cells) + " |")
    print()
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--steps", type=int, default=3)
    add_results_options(p, "bench_zero_memory")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    run = ResultsRun("bench_zero_memory")
    rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    for n in args.ranks:
        cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(n), sys.executable,
               str(Path(__file__).resolve()), "--worker", "--port", str(free_port()), "--steps", str(args.steps)]
        res = run_job_for_result(cmd, {**os.environ, "PYTHONPATH": str(REPO)}, "ZERO_MEMORY")
        if res is None:
            return 1
        summary += report(res)
        rows += [{"ranks": n, "model": key.split("/")[0], "config": key.split("/")[1], "rank": r, "bytes": b,
                  "peak_bytes": res["peak"][key][r]}
                 for key, per_rank in res["bytes"].items() for r, b in enumerate(per_rank)]
    run.write(results_path(args, "bench_zero_memory"), rows, summary,
              {k: v for k, v in vars(args).items() if k not in ("worker", "port")}, args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
