"""A Horovod-style elastic PyTorch training script, used by the elastic tests.

It trains a small MLP on synthetic data with ``hvd.elastic.run``, an ``ElasticSampler``
and a ``TorchState`` committed every ``--commit-every`` steps, exactly as a Horovod user
writes it. What it adds for the tests:

* ``HVDLITE_TEST_KILL="R:S[,R:S...]"``: the process that started as rank R kills itself
  (SIGKILL, no clean-up) just before its step S (counted over the whole run); workers
  that joined later never do; with ``HVDLITE_TEST_KILL_BY=raise`` it raises an
  exception that nothing catches instead, as a failing training script does; with
  ``HVDLITE_TEST_KILL_BY=hang`` it deadlocks (a lock taken twice) while hvdlite's own
  thread goes on;
* ``HVDLITE_TEST_CHAIN="K:E"``: K kills in a row, the k-th at step k*E, by the process
  that is then rank k % size (joined workers too); each kill leaves a file
  ``OUT/kill-k`` first, so that a step redone after the rollback kills no one again;
* ``HVDLITE_TEST_KILL_IN_RESET=R``: the process that started as rank R kills itself in
  its reset callback, while the others recover from the first failure;
* ``HVDLITE_TEST_OFFER="S:FILE:TEXT"``: at step S, rank 0 writes TEXT (``;`` for new
  lines) to FILE, which the test's discovery script prints: more slots on offer;
* ``HVDLITE_TEST_BALLOON=FILE``: once ``FILE.<hostname>`` exists, the worker on that
  host allocates 64 MiB more at every step (up to 4 GiB): a leak, for the kernel's OOM
  killer to stop under a memory limit;
* ``--checkpoint DIR``: at every commit of a step that is a multiple of 10, rank 0
  saves the model, optimizer and step count to ``DIR/w<first rank>/checkpoint.pt`` as a
  careful script does (a temporary file, then a rename); ``HVDLITE_TEST_FILL_DISK=S``:
  just before step S the process that started as rank 0 fills the disk under its
  checkpoint folder (a file written until the disk is full), as another program would;
* ``HVDLITE_TEST_PRINT_STEPS=1``: every completed step prints ``STEP <steps> <time>
  <rank> <host>`` (the fault tests inject their faults at a step);
* ``--optimizer zero``: ``ZeroRedundancyOptimizer(Adam)`` instead of
  ``DistributedOptimizer(SGD)`` (``zero3``: at stage 3); the result then has Adam's
  step count of every parameter, from the whole (gathered) state; ``--optimizer onebit``: ``OneBitAdam``
  (compressed from step 11); the result then has its step count and error buffers' layout;
* at the end each surviving process writes ``OUT/<pid>.json``: its first and last
  rank and size, a hash of the final parameters, the samples of every epoch that were
  committed as processed, every sample trained in the epoch's committed steps (each
  once, if none is lost or repeated), the steps, resets, and the times at which steps
  completed.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import socket
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd
from hvdlite.common import membership


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=480)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--commit-every", type=int, default=2)
    ap.add_argument("--step-sleep", type=float, default=0.01)
    ap.add_argument("--checkpoint", default=None, help="a folder: rank 0 saves a checkpoint every 10 steps")
    ap.add_argument("--device", default="cpu", help="cuda: the model and batches on GPU local_rank % count")
    ap.add_argument("--optimizer", choices=["sgd", "zero", "zero3", "onebit"], default="sgd",
                    help="zero: hvd.ZeroRedundancyOptimizer(Adam), its state sharded over the ranks "
                         "(zero3: at stage 3, the parameters too); "
                         "onebit: hvd.OneBitAdam, compressed after 10 steps")
    args = ap.parse_args()

    hvd.init()
    first_rank, first_size = hvd.rank(), hvd.size()
    kills = {}
    for item in filter(None, os.environ.get("HVDLITE_TEST_KILL", "").split(",")):
        r, s = item.split(":")
        kills[int(r)] = int(s)
    joined = membership.joined()
    my_kill = None if joined else kills.get(first_rank)
    offer = os.environ.get("HVDLITE_TEST_OFFER", "").split(":", 2)
    chain = [int(v) for v in os.environ.get("HVDLITE_TEST_CHAIN", "").split(":") if v]

    def chain_kill(step: int) -> None:
        if not chain or step == 0 or step % chain[1] or step // chain[1] > chain[0]:
            return
        k = step // chain[1]
        marker = os.path.join(args.out, f"kill-{k}")
        if hvd.rank() == k % hvd.size() and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    torch.manual_seed(1234)  # the same data everywhere; the model is synced by run()
    x = torch.randn(args.samples, 16)
    w = torch.randn(16, 1)
    y = x @ w + 0.1 * torch.randn(args.samples, 1)
    data = torch.utils.data.TensorDataset(x, y)

    dev = torch.device("cpu")
    if args.device == "cuda":
        dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    torch.manual_seed(100 + first_rank)  # different until the first sync
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).to(dev)
    if args.optimizer in ("zero", "zero3"):
        stage3 = {"stage": 3, "model": model} if args.optimizer == "zero3" else {}
        opt = hvd.ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01, **stage3)
    elif args.optimizer == "onebit":
        opt = hvd.OneBitAdam(model.parameters(), lr=0.01, freeze_step=10)
    else:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                                       named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=7)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0, steps=0,
                                   committed=[], trained=())
    resets = []
    die_in_reset = os.environ.get("HVDLITE_TEST_KILL_IN_RESET") == str(first_rank)

    def on_reset() -> None:
        resets.append((time.time(), hvd.rank(), hvd.size()))
        if die_in_reset:  # dies while the others are in the middle of recovering
            os.kill(os.getpid(), signal.SIGKILL)

    state.register_reset_callbacks([on_reset])
    completed = []
    print_steps = os.environ.get("HVDLITE_TEST_PRINT_STEPS") == "1"
    host = socket.gethostname()
    balloon_file = os.environ.get("HVDLITE_TEST_BALLOON")
    balloon: list[bytearray] = []

    def leak() -> None:
        if balloon_file and len(balloon) < 64 and os.path.exists(f"{balloon_file}.{host}"):
            balloon.append(bytearray(b"\x01") * (64 << 20))  # filled: every page touched
    epoch_samples: dict[int, list[int]] = {}
    epoch_trained: dict[int, list[int]] = {}

    fill_at = int(os.environ["HVDLITE_TEST_FILL_DISK"]) if os.environ.get("HVDLITE_TEST_FILL_DISK") else None
    my_checkpoints = os.path.join(args.checkpoint, f"w{first_rank}") if args.checkpoint else None

    def fill_disk() -> None:
        try:
            with open(os.path.join(my_checkpoints, "filler"), "wb") as f:
                while True:
                    f.write(b"\0" * (64 << 10))
                    f.flush()
        except OSError:
            pass

    def save_checkpoint(state) -> None:
        os.makedirs(my_checkpoints, exist_ok=True)
        path = os.path.join(my_checkpoints, "checkpoint.pt")
        torch.save({"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
                    "steps": state.steps}, path + ".tmp")
        os.replace(path + ".tmp", path)

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=state.sampler)
            # After a reset the sampler holds only the epoch's samples not yet committed.
            for idx, (xb, yb) in enumerate(loader):
                if my_kill is not None and state.steps == my_kill:
                    if os.environ.get("HVDLITE_TEST_KILL_BY") == "raise":
                        raise RuntimeError(f"the test's failure at step {state.steps}")
                    if os.environ.get("HVDLITE_TEST_KILL_BY") == "hang":
                        lock = threading.Lock()
                        lock.acquire()
                        lock.acquire()
                    os.kill(os.getpid(), signal.SIGKILL)
                chain_kill(state.steps)
                leak()
                if fill_at is not None and state.steps == fill_at and first_rank == 0 and not joined:
                    fill_disk()
                if len(offer) == 3 and hvd.rank() == 0 and state.steps == int(offer[0]):
                    with open(offer[1], "w") as f:
                        f.write(offer[2].replace(";", "\n") + "\n")
                state.optimizer.zero_grad()
                F.mse_loss(state.model(xb.to(dev)), yb.to(dev)).backward()
                state.optimizer.step()
                state.sampler.record_batch(idx, args.batch)
                # Every rank's samples trained in this step (a padding batch has none);
                # part of the state, so a step rolled back by a restore is forgotten.
                state.trained += tuple(i for part in hvd.allgather_object(
                    state.sampler.get_indices(idx, args.batch)) for i in part)
                state.steps += 1
                completed.append(time.time())
                if print_steps:
                    print(f"STEP {state.steps} {completed[-1]:.3f} {hvd.rank()} {host}", flush=True)
                time.sleep(args.step_sleep)
                if state.steps % args.commit_every == 0:
                    state.batch += idx + 1
                    state.commit()
                    if args.checkpoint and hvd.rank() == 0 and state.steps % 10 == 0:
                        save_checkpoint(state)
            state.batch = 0
            state.commit()  # the epoch's processed samples, every rank's, are in the commit
            epoch_samples[state.epoch] = hvd.allgather_object(sorted(state.sampler.processed_indices))
            epoch_trained[state.epoch] = list(state.trained)
            state.trained = ()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    # At stage 3 the parameters are whole only while gathered (a collective).
    with opt.gathered_parameters() if args.optimizer == "zero3" else contextlib.nullcontext():
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
        assert params.numel() == 16 * 32 + 32 + 32 + 1, params.numel()
    with torch.no_grad():
        loss = float(F.mse_loss(model(x.to(dev)), y.to(dev)))
    result = {
        "first_rank": first_rank, "first_size": first_size, "joined": joined,
        "rank": hvd.rank(), "size": hvd.size(),
        "params_sha": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
        "loss": loss, "steps": state.steps, "resets": resets,
        "completed": completed, "epoch_samples": epoch_samples,
        "epoch_trained": epoch_trained, "device": str(next(model.parameters()).device),
        # Horovod's per-worker variables, which follow the world through every reset.
        "horovod_env": [os.environ.get(f"HOROVOD_{k}") for k in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")],
        "horovod_env_expected": [str(v) for v in (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())],
    }
    if args.optimizer in ("zero", "zero3"):
        # Adam's step count of every parameter, from the whole state: each equals the
        # committed steps unless a lost rank's share was not recovered.
        whole = opt._gathered_state()
        result["optimizer_steps"] = sorted({float(st["step"]) for st in whole["state"].values()})
        result["optimizer_params"] = len(whole["state"])
        result["shards"] = [opt.rank, opt.world_size]
    if args.optimizer == "onebit":
        result["optimizer_steps"] = [opt.steps]
        result["error_layout"] = [opt.rank, opt.world_size, opt.worker_error.numel(), opt.server_error.numel()]
    with open(os.path.join(args.out, f"{os.getpid()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
