"""Train a small CNN on scikit-learn's bundled 8x8 digits images, data-parallel with hvdlite.

Run on 2 processes (any number that divides the global batch works):

    hvdlite-run -np 2 python examples/pytorch/train_digits_cnn.py
    mpirun -np 2 python examples/pytorch/train_digits_cnn.py

or, as the single-process reference on the same global batches (no hvdlite at all):

    python examples/pytorch/train_digits_cnn.py --reference

The data ships with scikit-learn (1,797 images, nothing is downloaded). Every step, the
global batch of ``--batch-size`` images is split evenly across the ranks; each rank
computes the mean loss of its share, and ``hvd.DistributedOptimizer`` averages the
gradients -- which is exactly the gradient of the mean loss over the whole global batch.
So the distributed run follows the single-process reference step for step and ends
with the same parameters and the same test accuracy (up to float rounding), whatever
the number of ranks. (In float32, sums taken in a different order differ in the last
bits, and over many steps a ReLU or max-pool decision can flip, so long runs drift apart
slightly; ``--float64`` makes that negligible.) Because the global batch stays fixed, the
learning rate is not scaled with the number of ranks here.

On a machine with GPUs (``--device cuda``, the default when PyTorch sees one) each rank
pins the GPU of its local rank, as Horovod's examples do, and the gradients are averaged
on the GPUs by NCCL.

``--optimizer adam`` trains with Adam instead of SGD, and ``--optimizer onebit-adam``
with ``hvd.OneBitAdam`` (1-bit compressed momentum after a warm-up; docs/zero.md).

``--zero-stage 1``, ``2`` or ``3`` replaces ``hvd.DistributedOptimizer`` by
``hvd.ZeroRedundancyOptimizer`` over the same SGD or Adam (docs/zero.md): each rank keeps
the optimizer state of one shard of the parameters (stage 1), also only that shard's
reduced gradients (stage 2), and also only that shard of the parameters (stage 3, which
gathers each layer's parameters just before it runs). The steps are the same as with
``DistributedOptimizer``, so the run ends with the same parameters up to rounding:

    hvdlite-run -np 2 python examples/pytorch/train_digits_cnn.py --optimizer adam --zero-stage 3

At stage 3 whatever reads the parameters outside forward and backward (the checkpoint,
``--save-params``, the broadcast of rank 0's initial parameters) does so inside
``optimizer.gathered_parameters()``, a collective every rank enters; the evaluation is
an ordinary forward and needs nothing. The checkpoint holds the whole optimizer state,
gathered on rank 0 by ``optimizer.consolidate_state_dict(to=0)``, so it is the same file
as without ZeRO: a run resumes from it at any stage and on any number of ranks.

Rank 0 shows a progress bar on stderr (its loss is the average over all ranks), prints
metrics averaged over all ranks, and writes a checkpoint after every epoch
(``--checkpoint``); ``--resume`` continues from it.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, TextIO

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, max-pooling and two fully connected layers (38 k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=64,
                   help="global batch size (split evenly across ranks)")
    p.add_argument("--optimizer", choices=["sgd", "adam", "onebit-adam"], default="sgd",
                   help="sgd: SGD with momentum; adam: Adam; both through hvd.DistributedOptimizer. "
                        "onebit-adam: hvd.OneBitAdam, distributed by itself: Adam for the first "
                        "--freeze-fraction of the steps, then 1-bit compressed momentum (in "
                        "--reference, where nothing is compressed, plain Adam)")
    p.add_argument("--lr", type=float, default=None, help="default: 0.05 for sgd, 0.003 for the Adams")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd's momentum")
    p.add_argument("--freeze-fraction", type=float, default=0.2,
                   help="onebit-adam only: the fraction of all steps run as uncompressed Adam "
                        "(it freezes Adam's variance, not parameters)")
    p.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=0,
                   help="0: the optimizer in hvd.DistributedOptimizer; 1, 2, 3: "
                        "hvd.ZeroRedundancyOptimizer over sgd or adam, sharding the optimizer "
                        "state (1), also the gradients (2), also the parameters (3). Not with "
                        "onebit-adam (distributed by itself) or --reference (no hvdlite)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default="digits_cnn_checkpoint.pt",
                   help="checkpoint written by rank 0 after every epoch ('' to disable)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if it exists")
    p.add_argument("--save-params", default="", metavar="PATH",
                   help="write the final parameters to PATH (.npz) from rank 0")
    p.add_argument("--reference", action="store_true",
                   help="train in this single process on the same global batches, without hvdlite")
    p.add_argument("--float64", action="store_true",
                   help="train in float64: distributed and reference runs then agree to ~1e-12")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where to train: auto picks the GPU of this rank's local rank when PyTorch sees one")
    p.add_argument("--threads", type=int, default=1,
                   help="PyTorch threads per process (ranks usually share the cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.float64 and args.optimizer == "onebit-adam":
        p.error("onebit-adam packs float32 values; drop --float64")
    if args.zero_stage and args.optimizer == "onebit-adam":
        p.error("--zero-stage does not combine with --optimizer onebit-adam: hvd.OneBitAdam "
                "reduces its own compressed momentum and cannot be sharded by "
                "ZeroRedundancyOptimizer; use --optimizer adam or sgd with --zero-stage")
    if args.zero_stage and args.reference:
        p.error("--zero-stage shards over hvdlite's ranks; --reference runs without hvdlite "
                "(it ends where every stage ends: drop --zero-stage)")
    if args.resume and args.optimizer == "onebit-adam":
        p.error("--resume with onebit-adam: its error-feedback buffers differ on every rank, and this "
                "example's checkpoint is rank 0's alone")
    if args.lr is None:
        args.lr = 0.05 if args.optimizer == "sgd" else 0.003
    return args


class Comm:
    """The few distributed calls this script makes, with a no-op single-process version
    for --reference."""

    def __init__(self, reference: bool) -> None:
        self.reference = reference
        if reference:
            self.hvd = None
            self.rank, self.size, self.local_size, self.local_rank = 0, 1, 1, 0
        else:
            import hvdlite.torch as hvd
            hvd.init()
            self.hvd = hvd
            self.rank, self.size, self.local_size = hvd.rank(), hvd.size(), hvd.local_size()
            self.local_rank = hvd.local_rank()

    def sum(self, values: list[float]) -> list[float]:
        if self.hvd is None:
            return values
        return self.hvd.allreduce(torch.tensor(values, dtype=torch.float64),
                                  op=self.hvd.Sum).tolist()

    def average_later(self, value: torch.Tensor) -> Callable[[], float]:
        """Start averaging a scalar over the ranks without waiting; the returned function
        waits for the result. (Every rank must call it, in the same order.)"""
        if self.hvd is None:
            v = float(value)
            return lambda: v
        handle = self.hvd.allreduce_async(value.detach().reshape(1).to(torch.float64),
                                          name="progress.loss", op=self.hvd.Average)
        return lambda: float(self.hvd.synchronize(handle)[0])


def bar_size(stream: TextIO) -> dict[str, Any]:
    """tqdm size arguments for ``stream``. Under mpirun (and hvdlite-run) a rank's output
    can be a pseudo-terminal of size 0x0, or a pipe; tqdm then thinks there are no rows
    to draw on and prints no bar at all. Give it a definite size in that case."""
    try:
        cols, rows = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        cols = rows = 0
    if cols > 0 and rows > 0:
        return {}  # a real terminal: tqdm follows its size
    fallback = shutil.get_terminal_size((80, 24))  # $COLUMNS/$LINES if set
    return {"ncols": fallback.columns if fallback.columns > 0 else 80,
            "nrows": fallback.lines if fallback.lines > 0 else 24}


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]  # (N, 1, 8, 8) in [0, 1]
    x_tr, x_te, y_tr, y_te = train_test_split(x, digits.target, test_size=0.2,
                                              random_state=seed, stratify=digits.target)
    return (torch.from_numpy(x_tr), torch.from_numpy(y_tr).long(),
            torch.from_numpy(x_te), torch.from_numpy(y_te).long())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    comm = Comm(args.reference)
    rank, size = comm.rank, comm.size
    torch.set_num_threads(args.threads)
    if args.batch_size % size:
        if rank == 0:
            print(f"--batch-size {args.batch_size} must be divisible by the number of ranks "
                  f"({size})", file=sys.stderr)
        return 2
    local_batch = args.batch_size // size
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        # One GPU per process: the one of this rank's index on its host.
        torch.cuda.set_device(comm.local_rank % torch.cuda.device_count())
    device = torch.device("cuda" if use_cuda else "cpu")

    x_tr, y_tr, x_te, y_te = (t.to(device) for t in load_data(args.seed))
    torch.manual_seed(args.seed)
    model = DigitsCNN().to(device)
    if args.float64:
        model, x_tr, x_te = model.double(), x_tr.double(), x_te.double()
    hvd = comm.hvd
    steps = len(x_tr) // args.batch_size  # incomplete global batches are dropped
    onebit = args.optimizer == "onebit-adam" and hvd is not None
    zero = args.zero_stage if hvd is not None else 0

    start_epoch = 0
    ckpt = Path(args.checkpoint) if args.checkpoint else None
    state = None
    if args.resume and ckpt is not None and rank == 0 and ckpt.exists():
        state = torch.load(ckpt, weights_only=False, map_location="cpu")
    if zero:
        # Every rank loads the whole optimizer state and keeps its shard's part of it.
        state = hvd.broadcast_object(state, root_rank=0, name="checkpoint")
    if state is not None:
        # Before the optimizer is built: at stage 3 it takes the parameters into its shards.
        model.load_state_dict(state["model"])
        start_epoch = state["epoch"] + 1

    optimizer: torch.optim.Optimizer
    optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam
    hyperparameters: dict[str, Any] = {"lr": args.lr}
    if args.optimizer == "sgd":
        optimizer_class, hyperparameters["momentum"] = torch.optim.SGD, args.momentum
    if onebit:
        optimizer = hvd.OneBitAdam(model.parameters(), lr=args.lr,
                                   freeze_step=int(args.freeze_fraction * steps * args.epochs))
    elif zero:
        # It reduces the gradients itself: not wrapped in DistributedOptimizer.
        optimizer = hvd.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer_class,
                                                stage=zero, model=model if zero == 3 else None,
                                                **hyperparameters)
    else:
        optimizer = optimizer_class(model.parameters(), **hyperparameters)
    if state is not None and (zero or rank == 0):
        optimizer.load_state_dict(state["optimizer"])

    if hvd is not None:
        if not onebit and not zero:
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        # Start every rank from rank 0's parameters, optimizer state and epoch. (At stage 3
        # the parameters live in the shards: gathered for the broadcast, and what they hold
        # afterwards goes back into the shards. ZeRO's optimizer state came from the
        # checkpoint on every rank.)
        with parameters_gathered(optimizer, zero, modify=True):
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if not onebit and not zero:   # (onebit-adam never resumes: see parse_args)
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        start_epoch = hvd.broadcast_object(start_epoch, root_rank=0)

    progress = not args.no_progress  # the same on every rank: all average the bar's loss
    show = rank == 0 and progress
    if show:
        from tqdm import tqdm
    t0 = time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        model.train()
        order = torch.from_numpy(np.random.default_rng(args.seed + epoch).permutation(len(x_tr))).to(device)
        loss_sum = correct = seen = 0.0
        bar = tqdm(total=steps, desc=f"epoch {epoch + 1}/{args.epochs}", leave=False,
                   file=sys.stderr, **bar_size(sys.stderr)) if show else None
        for step in range(steps):
            idx = order[step * args.batch_size + rank * local_batch:
                        step * args.batch_size + (rank + 1) * local_batch]
            x, y = x_tr[idx], y_tr[idx]
            optimizer.zero_grad()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            # The bar's loss is averaged over the ranks; the allreduce of this one number
            # runs alongside backward and the gradient allreduces.
            bar_loss = comm.average_later(loss) if progress else None
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            seen += len(y)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{bar_loss():.3f}")
            elif bar_loss is not None:
                bar_loss()
        if bar is not None:
            bar.close()
        loss_sum, correct, seen = comm.sum([loss_sum, correct, seen])
        test_acc = evaluate(model, x_te, y_te, comm)
        if rank == 0:
            print(f"epoch {epoch + 1:3d}: train loss {loss_sum / seen:.4f}  "
                  f"train accuracy {correct / seen:.4f}  test accuracy {test_acc:.4f}", flush=True)
        if ckpt is not None:
            if zero:
                optimizer.consolidate_state_dict(to=0)   # every rank; the whole state on rank 0
            with parameters_gathered(optimizer, zero):   # every rank (stage 3: a collective)
                if rank == 0:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "epoch": epoch}, ckpt)

    test_acc = evaluate(model, x_te, y_te, comm)
    if rank == 0:
        mode = "single process (reference)" if args.reference else f"{size} ranks"
        mode += " on GPUs" if use_cuda else ""
        mode += f" with ZeRO stage {zero}" if zero else ""
        print(f"trained on {mode} in {time.perf_counter() - t0:.1f} s")
        print(f"final test accuracy: {test_acc:.4f}", flush=True)
    if args.save_params:
        with parameters_gathered(optimizer, zero):   # every rank (stage 3: a collective)
            if rank == 0:
                np.savez(args.save_params, **{k: v.detach().cpu().numpy()
                                              for k, v in model.state_dict().items()})
                print(f"saved parameters to {args.save_params}")
    if hvd is not None:
        hvd.shutdown()
    return 0


def parameters_gathered(optimizer: torch.optim.Optimizer, zero: int,
                        modify: bool = False) -> ContextManager[Any]:
    """Inside, the model's parameters are whole on every rank. Only ZeRO stage 3 frees them
    between uses; ``gathered_parameters()`` then is a collective that every rank enters
    (``modify``: what the parameters hold at the end goes back into the shards; at stages
    1 and 2 it does nothing). Without ZeRO nothing happens."""
    return optimizer.gathered_parameters(modify=modify) if zero else contextlib.nullcontext()


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, comm: Comm) -> float:
    """Accuracy on the test set; each rank scores a slice, the counts are summed. (A
    forward under no_grad: at ZeRO stage 3 it gathers each layer's parameters itself.)"""
    model.eval()
    mine = slice(comm.rank, None, comm.size)
    with torch.no_grad():
        correct = (model(x[mine]).argmax(1) == y[mine]).sum().item()
    correct, total = comm.sum([float(correct), float(len(y[mine]))])
    return correct / total


if __name__ == "__main__":
    sys.exit(main())
