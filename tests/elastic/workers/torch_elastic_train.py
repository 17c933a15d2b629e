"""A Horovod-style elastic PyTorch training script, used by the elastic tests.

It trains a small MLP on synthetic data with ``hvd.elastic.run``, an ``ElasticSampler``
and a ``TorchState`` committed every ``--commit-every`` steps, exactly as a Horovod user
writes it. What it adds for the tests:

* ``HVDLITE_TEST_KILL="R:S[,R:S...]"``: the process that started as rank R kills itself
  (SIGKILL, no clean-up) just before its step S (counted over the whole run);
* at the end each surviving process writes ``OUT/<pid>.json``: its first and last
  rank and size, a hash of the final parameters, the samples of every epoch that were
  committed as processed, the steps, resets, and the times at which steps completed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=480)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--commit-every", type=int, default=2)
    ap.add_argument("--step-sleep", type=float, default=0.01)
    args = ap.parse_args()

    hvd.init()
    first_rank, first_size = hvd.rank(), hvd.size()
    kills = {}
    for item in filter(None, os.environ.get("HVDLITE_TEST_KILL", "").split(",")):
        r, s = item.split(":")
        kills[int(r)] = int(s)
    my_kill = kills.get(first_rank) if os.environ.get("HVDLITE_TEST_SPAWNED") is None else None

    torch.manual_seed(1234)  # the same data everywhere; the model is synced by run()
    x = torch.randn(args.samples, 16)
    w = torch.randn(16, 1)
    y = x @ w + 0.1 * torch.randn(args.samples, 1)
    data = torch.utils.data.TensorDataset(x, y)

    torch.manual_seed(100 + first_rank)  # different until the first sync
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=7)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0, steps=0,
                                   committed=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append((time.time(), hvd.rank(), hvd.size()))])
    completed = []
    epoch_samples: dict[int, list[int]] = {}

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=state.sampler)
            # After a reset the sampler holds only the epoch's samples not yet committed.
            for idx, (xb, yb) in enumerate(loader):
                if my_kill is not None and state.steps == my_kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                state.optimizer.zero_grad()
                F.mse_loss(state.model(xb), yb).backward()
                state.optimizer.step()
                state.sampler.record_batch(idx, args.batch)
                state.steps += 1
                completed.append(time.time())
                time.sleep(args.step_sleep)
                if state.steps % args.commit_every == 0:
                    state.batch += idx + 1
                    state.commit()
            state.batch = 0
            state.commit()  # the epoch's processed samples, every rank's, are in the commit
            epoch_samples[state.epoch] = hvd.allgather_object(sorted(state.sampler.processed_indices))
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    with torch.no_grad():
        loss = float(F.mse_loss(model(x), y))
    result = {
        "first_rank": first_rank, "first_size": first_size,
        "rank": hvd.rank(), "size": hvd.size(),
        "params_sha": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
        "loss": loss, "steps": state.steps, "resets": resets,
        "completed": completed, "epoch_samples": epoch_samples,
    }
    with open(os.path.join(args.out, f"{os.getpid()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
