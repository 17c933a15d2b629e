"""ZeRO: hvdlite's ZeroRedundancyOptimizer at stages 1, 2 and 3 against PyTorch's own
(stage 1) and PyTorch's FSDP2 (stages 2 and 3) on gloo, DeepSpeed's ZeRO 2 and 3 where it
is installed, and hvdlite's DistributedOptimizer, side by side.

    python benchmarks/bench_zero.py [--ranks 2] [--model mlp] [--rounds 3] [--steps 10]
                                    [--windows 5] [--warmup 5] [--quick] [--json-out F]
                                    [--results PATH]

Run it with plain ``python``: it launches itself with ``hvdlite-run -np RANKS``. Every
rank also joins a ``torch.distributed`` gloo group (rendezvous on this host), so all
configurations run in the same processes, in turn, ``--rounds`` times (the order moves
by one each round, so drift hits all alike):

* ``hvd_zero``: ``hvdlite.torch.ZeroRedundancyOptimizer(params, optimizer_class=Adam)``;
* ``hvd_zero2``, ``hvd_zero3``: the same at ``stage=2`` and at ``stage=3, model=model``;
* ``hvd_dist``: ``hvdlite.torch.DistributedOptimizer(Adam)`` (full state on every rank);
* ``torch_zero``: ``DistributedDataParallel`` (gloo) with
  ``torch.distributed.optim.ZeroRedundancyOptimizer(optimizer_class=Adam)``, PyTorch's
  own: DDP allreduces the gradients, each rank steps its share, and each parameter is
  broadcast from its owner;
* ``ddp_adam``: DDP (gloo) with plain Adam, for scale;
* ``fsdp2_zero2``, ``fsdp2_zero3``: PyTorch's FSDP2, ``torch.distributed.fsdp.fully_shard``
  on a 1-D CPU device mesh over the same gloo group, applied to each ``Linear`` (and
  ``Embedding``, and each residual block of ``resnet``) and then to the whole model, with
  plain ``torch.optim.Adam`` on the sharded parameters: ``reshard_after_forward=False``
  keeps the gathered parameters from forward to backward (ZeRO-2-like: sharded gradients
  and optimizer state), ``True`` frees them after forward and gathers them again for
  backward (ZeRO-3-like);
* ``ds_zero2``, ``ds_zero3``: DeepSpeed's engine with ``zero_optimization.stage`` 2 and 3
  (float32, the same ``torch.optim.Adam``, on the same gloo group through DeepSpeed's CPU
  accelerator), only when ``deepspeed`` can be imported; otherwise left out with the
  reason printed.

Model: ``examples/pytorch/pytorch_synthetic_benchmark.py``'s ``mlp`` (9.56 M parameters in
40 tensors, batch 64 per rank, synthetic data, ``torch.set_num_threads(1)``). A
configuration's figure is the median window's steps per second (a window is ``--steps``
steps between barriers, timed by the slowest rank); the report gives the median over
rounds and the ratios within each round, among them each hvdlite stage over its peers:
``hvd_zero2 ÷ fsdp2_zero2``, ``hvd_zero3 ÷ fsdp2_zero3`` (and the same over ``ds_zero2``,
``ds_zero3``); above 1, hvdlite takes more steps per second.

Also printed, from the hvdlite ZeRO run: the largest per-rank share of Adam's state
against the unsharded state (bytes of tensors in the optimizer state), the largest
difference between its parameters and ``hvd_dist``'s after the same steps on the same
data (and the same for each FSDP2 and DeepSpeed configuration), and the bytes each rank
sends per step: hvdlite ZeRO from its buckets (``bytes_per_step``), the others by their
algorithms' counts (a ring allreduce sends 2(N-1)/N of the gradients; PyTorch's ZeRO adds
each owner's parameters to N-1 ranks; FSDP2 and DeepSpeed send each rank's shard of the
parameters to N-1 ranks once per gather, once at stage 2 and twice at stage 3, and
reduce-scatter the gradients, (N-1)/N of them).

The results file (``benchmarks/_common.py``: command, machine, date, commit, every
round's steps per second and the figures above) goes to
``benchmarks/results/bench_zero.json`` by default; ``--quick`` writes none unless
``--results PATH`` is given.
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
from _common import (REPO, ResultsRun, add_results_options, free_port, load_synthetic_models,  # noqa: E402
                     results_path, run_job_for_result)

BATCH = 64
CONFIGS = ["hvd_zero", "hvd_zero2", "hvd_zero3", "hvd_dist", "torch_zero", "ddp_adam", "fsdp2_zero2", "fsdp2_zero3"]
DS_CONFIGS = ["ds_zero2", "ds_zero3"]
# hvdlite's stage over the peer's that shards the same things: (hvdlite, peer).
PEER_PAIRS = [("hvd_zero2", "fsdp2_zero2"), ("hvd_zero3", "fsdp2_zero3"),
              ("hvd_zero2", "ds_zero2"), ("hvd_zero3", "ds_zero3")]


def state_bytes(opt: Any) -> int:
    import torch
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


def deepspeed_missing() -> str:
    """Why DeepSpeed's configurations cannot run in this environment ('' when they can)."""
    import importlib
    try:
        importlib.import_module("deepspeed")
    except Exception as e:  # not installed, or installed without what it needs
        return f"deepspeed cannot be imported ({type(e).__name__}: {e})"
    return ""


def deepspeed_version() -> str | None:
    """The installed DeepSpeed's version, read from its metadata (None without it)."""
    from importlib import metadata
    try:
        return metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return None


def pair_key(ours: str, peer: str) -> str:
    return f"{ours}_over_{peer}"


def fsdp2_units(model: Any) -> list[Any]:
    """The submodules FSDP2 shards one by one before the root, innermost first: each
    ``Linear`` and ``Embedding`` and each residual block, so that one layer's parameters are
    gathered at a time."""
    import torch.nn as nn
    units = [m for m in model.modules() if m is not model and
             (isinstance(m, (nn.Linear, nn.Embedding)) or type(m).__name__ == "BasicBlock")]
    return units[::-1]


# ---------------------------------------------------------------- inside the job
def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=n)
    # FSDP2 shards over a device mesh: one dimension of all ranks, on the CPU, which uses the
    # gloo group above.
    mesh = init_device_mesh("cpu", (n,))
    ds_skip = "left out (--no-deepspeed)" if args.no_deepspeed else deepspeed_missing()
    configs = CONFIGS + ([] if ds_skip else DS_CONFIGS)
    if not ds_skip:
        import logging
        import warnings

        import deepspeed
        deepspeed.utils.logger.setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
        # DeepSpeed joins the gloo group above (its CPU accelerator's backend without oneCCL).
        deepspeed.init_distributed(dist_backend="gloo")
    mod = load_synthetic_models()
    data, target = mod.synthetic_batch(args.model, BATCH, seed=rank)

    def fresh() -> Any:
        torch.manual_seed(0)
        return mod.MODELS[args.model][0]()

    def build(config: str) -> tuple[Any, Any]:
        model = fresh()
        if config == "hvd_zero":
            return model, hvd.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
        if config == "hvd_zero2":
            return model, hvd.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4,
                                                      stage=2)
        if config == "hvd_zero3":
            return model, hvd.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4,
                                                      stage=3, model=model)
        if config == "hvd_dist":
            return model, hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-4),
                                                   named_parameters=model.named_parameters())
        if config.startswith("fsdp2_"):
            for unit in fsdp2_units(model):
                fully_shard(unit, mesh=mesh, reshard_after_forward=config == "fsdp2_zero3")
            fully_shard(model, mesh=mesh, reshard_after_forward=config == "fsdp2_zero3")
            return model, torch.optim.Adam(model.parameters(), lr=1e-4)
        if config.startswith("ds_"):
            import deepspeed
            ds_config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
                         "zero_optimization": {"stage": int(config[-1])}, "steps_per_print": 2**31 - 1}
            engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-4),
                                              config=ds_config)
            return engine, None  # the engine steps its own optimizer
        ddp = DDP(model, broadcast_buffers=False)
        if config == "torch_zero":
            return ddp, TorchZero(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=1e-4)
        return ddp, torch.optim.Adam(ddp.parameters(), lr=1e-4)

    def steps(model: Any, opt: Any, k: int) -> None:
        for _ in range(k):
            if opt is None:  # a DeepSpeed engine
                model.backward(F.cross_entropy(model(data), target))
                model.step()
                continue
            opt.zero_grad()
            F.cross_entropy(model(data), target).backward()
            opt.step()

    def full_params(config: str, model: Any) -> list[Any]:
        """The model's whole parameters, as every configuration holds them after its steps."""
        if config.startswith("fsdp2_"):
            return [p.full_tensor() for p in model.parameters()]
        if config == "ds_zero3":
            import deepspeed
            params = list(model.module.parameters())
            with deepspeed.zero.GatheredParameters(params):
                return [p.detach().clone() for p in params]
        if config.startswith("ds_"):
            return [p.detach() for p in model.module.parameters()]
        return [p.detach() for p in model.parameters()]

    def peer_bytes(config: str, model: Any) -> int:
        """Bytes a rank sends per step at FSDP2's or DeepSpeed's stage by the algorithm's count:
        its shard (dimension 0 padded to a multiple of N for FSDP2) to N-1 ranks per gather of
        the parameters, and (N-1)/N of the gradients in the reduce-scatter."""
        params = full_params(config, model)
        if config.startswith("fsdp2_"):
            shard = sum(-(-p.shape[0] // n) * (p.numel() // max(p.shape[0], 1)) * p.element_size() for p in params)
        else:
            shard = sum(-(-p.numel() // n) * p.element_size() for p in params)
        gathers = 2 if config.endswith("zero3") else 1
        return shard * (n - 1) * gathers + shard * (n - 1)

    def slowest(t: float) -> float:
        return float(hvd.allreduce(torch.tensor([t]), op=hvd.Max, name="bench.zero.sync").item())

    # Correctness and memory first: the same steps through ZeRO and DistributedOptimizer.
    figures: dict[str, Any] = {}
    (mz, oz), (md, od) = build("hvd_zero"), build("hvd_dist")
    steps(mz, oz, args.check_steps)
    steps(md, od, args.check_steps)
    diff = max((a - b).abs().max().item() for a, b in zip(mz.parameters(), md.parameters()))
    figures["max_param_diff"] = max(hvd.allgather_object(diff))
    shares = hvd.allgather_object(state_bytes(oz.optim))
    figures["state_share_max"] = max(shares) / state_bytes(od)
    figures["state_bytes"] = {"unsharded": state_bytes(od), "per_rank": shares}
    grad_bytes = sum(p.numel() * p.element_size() for p in md.parameters())
    figures["bytes_per_step"] = {
        "hvd_zero": max(hvd.allgather_object(oz.bytes_per_step())),
        "hvd_zero2": max(hvd.allgather_object(oz.bytes_per_step())),
        # Stage 3 gathers every parameter twice (forward and backward) instead of once.
        "hvd_zero3": max(hvd.allgather_object(oz.bytes_per_step() + sum(
            f.shard * (n - 1) * f.dtype.itemsize for fs in oz._flats for f in fs))),
        "hvd_dist": int(2 * (n - 1) / n * grad_bytes),
        "ddp_adam": int(2 * (n - 1) / n * grad_bytes),
    }
    tz = TorchZero(list(fresh().parameters()), optimizer_class=torch.optim.Adam, lr=1e-4)
    owned = sum(p.numel() * p.element_size() for p in tz.optim.param_groups[0]["params"])
    figures["bytes_per_step"]["torch_zero"] = int(2 * (n - 1) / n * grad_bytes) + max(
        hvd.allgather_object(owned * (n - 1)))
    # The peers that shard gradients and parameters: the same steps, the same check.
    figures["peer_param_diff"] = {}
    ref = full_params("hvd_dist", md)
    for config in [c for c in configs if c.startswith(("fsdp2_", "ds_"))]:
        model, opt = build(config)
        steps(model, opt, args.check_steps)
        diff = max((a - b).abs().max().item() for a, b in zip(full_params(config, model), ref))
        figures["peer_param_diff"][config] = max(hvd.allgather_object(diff))
        figures["bytes_per_step"][config] = max(hvd.allgather_object(peer_bytes(config, model)))
        del model, opt
    del mz, oz, md, od, tz, ref

    times: dict[str, list[float]] = {c: [] for c in configs}
    for rnd in range(args.rounds):
        for k in range(len(configs)):
            config = configs[(rnd + k) % len(configs)]
            model, opt = build(config)
            steps(model, opt, args.warmup)
            windows = []
            for _ in range(args.windows):
                hvd.barrier()
                t0 = time.perf_counter()
                steps(model, opt, args.steps)
                windows.append(slowest(time.perf_counter() - t0))
            times[config].append(args.steps / statistics.median(windows))
            del model, opt
    if rank == 0:
        print("ZERO_RESULT " + json.dumps({"figures": figures, "steps_per_s": times,
                                           "skipped": {c: ds_skip for c in DS_CONFIGS} if ds_skip else {}}),
              flush=True)
    dist.destroy_process_group()
    hvd.shutdown()


# ---------------------------------------------------------------- outside
def report(res: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    f, sps = res["figures"], res["steps_per_s"]
    ran = [c for c in CONFIGS + DS_CONFIGS if c in sps]
    med = {c: statistics.median(sps[c]) for c in ran}
    paired = {c: statistics.median(a / b for a, b in zip(sps["hvd_zero"], sps[c])) for c in ran}
    per_round = {pair_key(a, b): [x / y for x, y in zip(sps[a], sps[b])] for a, b in PEER_PAIRS if b in sps}
    peers = {k: statistics.median(v) for k, v in per_round.items()}
    peers_range = {k: [min(v), max(v)] for k, v in per_round.items()}
    print(f"\nZeRO, {args.ranks} ranks, model {args.model}, Adam, {args.rounds} rounds\n")
    print("| optimizer | steps/s (median) | rounds | hvd_zero ÷ it (paired) | bytes sent per rank per step |")
    print("| --- | --- | --- | --- | --- |")
    for c in ran:
        print(f"| {c} | {med[c]:.2f} | {', '.join(f'{x:.2f}' for x in sps[c])} | {paired[c]:.3f} | "
              f"{f['bytes_per_step'][c] / 2**20:.1f} MiB |")
    print("\nhvdlite over its peers, steps/s (paired; above 1: hvdlite is faster): " +
          ", ".join(f"{a} ÷ {b} {peers[pair_key(a, b)]:.3f}" for a, b in PEER_PAIRS if b in sps))
    for c, why in res.get("skipped", {}).items():
        print(f"{c}: not run: {why}")
    print(f"\nlargest per-rank share of Adam's state: {f['state_share_max']:.3f} of the unsharded "
          f"{f['state_bytes']['unsharded'] / 2**20:.1f} MiB (per rank: "
          f"{', '.join(f'{b / 2**20:.1f}' for b in f['state_bytes']['per_rank'])} MiB)")
    print(f"largest parameter difference to DistributedOptimizer(Adam) after {args.check_steps} steps: "
          f"{f['max_param_diff']:.3g} (hvd_zero); " +
          ", ".join(f"{v:.3g} ({c})" for c, v in f.get("peer_param_diff", {}).items()))
    return {"ranks": args.ranks, "model": args.model, "median_steps_per_s": med, "paired_ratio": paired,
            "peer_ratio": peers, "peer_ratio_range": peers_range, **res}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--model", default="mlp", choices=["mlp", "resnet"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--check-steps", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="1 round of 2 short windows: checks that it runs")
    p.add_argument("--json-out", default="")
    p.add_argument("--no-deepspeed", action="store_true",
                   help="leave out ds_zero2 and ds_zero3 even where deepspeed is installed")
    add_results_options(p, "bench_zero")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.windows, args.warmup, args.check_steps = 1, 2, 2, 1, 3
    if args.worker:
        worker(args)
        return 0
    cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(args.ranks), sys.executable,
           str(Path(__file__).resolve()), "--worker", "--port", str(free_port()), "--model", args.model,
           "--rounds", str(args.rounds), "--steps", str(args.steps), "--windows", str(args.windows),
           "--warmup", str(args.warmup), "--check-steps", str(args.check_steps)] + (
               ["--no-deepspeed"] if args.no_deepspeed else [])
    run = ResultsRun("bench_zero")
    res = run_job_for_result(cmd, {**os.environ, "PYTHONPATH": str(REPO)}, "ZERO_RESULT")
    if res is None:
        return 1
    out = report(res, args)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    ran = list(out["median_steps_per_s"])
    rows = [{"config": c, "round": i, "steps_per_s": v} for c in ran for i, v in enumerate(res["steps_per_s"][c])]
    summary = [{"config": c, "steps_per_s": out["median_steps_per_s"][c],
                "steps_per_s_range": [min(res["steps_per_s"][c]), max(res["steps_per_s"][c])],
                "hvd_zero_over_it": out["paired_ratio"][c],
                "bytes_per_step": res["figures"]["bytes_per_step"][c]} for c in ran]
    run.write(results_path(args, "bench_zero", args.quick), rows, summary,
              {k: v for k, v in vars(args).items() if k not in ("worker", "port")}, args.notes,
              extra={"figures": res["figures"], "peer_ratio": out["peer_ratio"],
                     "peer_ratio_range": out["peer_ratio_range"],
                     "skipped": res.get("skipped", {}), "deepspeed": deepspeed_version()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
