"""Horovod-style elastic training of a small MLP on scikit-learn's bundled digits.

    hvdlite-run -np 4 --min-np 2 --max-np 4 python examples/pytorch/train_digits_elastic.py

The model, optimizer, sampler, epoch and batch live in an ``hvd.elastic.TorchState``;
``hvd.elastic.ElasticSampler`` splits the data and records what was processed; the state
is committed every few batches; ``@hvd.elastic.run`` starts every rank from rank 0's
state. Kill any worker while it trains (``kill -9 PID``, rank 0 included, or
``--die-at-step``): the others go back to the last commit, rebuild the world among
themselves and finish; the learning rate follows the number of workers through a reset
callback. With ``--host-discovery-script`` offering more slots, new workers join.
Launched without the elastic options it runs as a plain data-parallel job.
"""
from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdlite.torch as hvd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batches-per-commit", type=int, default=5)
    p.add_argument("--die-at-step", type=int, default=None,
                   help="the worker that starts as the last rank kills itself at this step (a demo)")
    args = p.parse_args()

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(hvd.rank())  # different on every rank: run() makes them rank 0's
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    train_set = torch.utils.data.TensorDataset(x_tr, y_tr)

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9),
        named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=1)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    def scale_lr() -> None:  # after a worker is lost or added: lr x the number of workers
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state.register_reset_callbacks([scale_lr])
    doomed = args.die_at_step is not None and hvd.rank() == hvd.size() - 1
    steps = 0

    @hvd.elastic.run
    def train(state):
        nonlocal steps
        loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size,
                                             sampler=state.sampler)
        for state.epoch in range(state.epoch, args.epochs):
            total = torch.zeros(2, dtype=torch.float64)  # loss sum, samples
            for idx, (xb, yb) in enumerate(loader):
                steps += 1
                if doomed and steps == args.die_at_step:
                    os.kill(os.getpid(), signal.SIGKILL)  # no clean-up, as a crash
                state.optimizer.zero_grad()
                loss = F.cross_entropy(state.model(xb), yb)
                loss.backward()
                state.optimizer.step()
                state.sampler.record_batch(idx, args.batch_size)
                state.batch += 1
                total += torch.tensor([loss.item() * len(yb), len(yb)], dtype=torch.float64)
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
            total = hvd.allreduce(total, op=hvd.Sum, name="epoch.loss")
            if hvd.rank() == 0:
                print(f"epoch {state.epoch + 1}: loss {total[0] / total[1]:.4f}", flush=True)
            state.batch = 0
            state.sampler.set_epoch(state.epoch + 1)
            state.commit()

    train(state)
    if hvd.rank() == 0:  # the model is the same on every rank
        with torch.no_grad():
            accuracy = (model(x_te).argmax(1) == y_te).float().mean()
        print(f"final test accuracy: {float(accuracy):.4f}", flush=True)


if __name__ == "__main__":
    main()
