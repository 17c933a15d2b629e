"""What the Ray and Spark tests share: functions the ranks run, and a look for
processes a job left behind."""
from __future__ import annotations

import os
import time

import numpy as np


def allreduce_rank(scale: float, offset: int = 0) -> tuple[int, int, list[float]]:
    """Each rank's rank, size and the sum of (rank + offset) * scale over the ranks."""
    import hvdlite as hvd
    hvd.init()
    x = np.full(3, hvd.rank() + offset, np.float64)
    return hvd.rank(), hvd.size(), (hvd.allreduce(x, op=hvd.Sum) * scale).tolist()


def raise_on_rank_one() -> None:
    import hvdlite as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise KeyError("rank one refuses")
    hvd.allreduce(np.ones(2), name="waits.for.rank.one")


def train_linear(seed: int, steps: int = 20) -> list[float]:
    """A least-squares model trained with averaged gradients from every rank's shard
    (float64, plain SGD): the parameters at the end, the same on every rank."""
    import hvdlite as hvd
    hvd.init()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, 5))
    y = x @ np.arange(1.0, 6.0) + 0.1 * rng.standard_normal(64)
    w = hvd.broadcast(rng.standard_normal(5), root_rank=0, name="w0")
    shard = slice(hvd.rank(), None, hvd.size())
    for step in range(steps):
        xs, ys = x[shard], y[shard]
        grad = 2 * xs.T @ (xs @ w - ys) / len(ys)
        w = w - 0.05 * hvd.allreduce(grad, op=hvd.Average, name=f"g{step}")
    return w.tolist()


def reference_linear(seed: int, size: int, steps: int = 20) -> np.ndarray:
    """:func:`train_linear` in one process, averaging the shards' gradients with NumPy."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, 5))
    y = x @ np.arange(1.0, 6.0) + 0.1 * rng.standard_normal(64)
    w = rng.standard_normal(5)
    for _ in range(steps):
        grads = []
        for r in range(size):
            xs, ys = x[r::size], y[r::size]
            grads.append(2 * xs.T @ (xs @ w - ys) / len(ys))
        w = w - 0.05 * np.mean(grads, axis=0)
    return w


def hold(seconds: float = 120.0) -> None:
    """Join the job, then wait (for a test to break something meanwhile)."""
    import hvdlite as hvd
    hvd.init()
    time.sleep(seconds)


def call_in_background(fn, *args, **kwargs):
    """Start ``fn(*args, **kwargs)`` in a thread; returns the thread and a dict that
    gets the exception it raised under ``"error"``."""
    import threading
    failure: dict = {}

    def call() -> None:
        try:
            fn(*args, **kwargs)
        except BaseException as exc:
            failure["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    return thread, failure


def paired_ranks() -> list[int]:
    """Process ids of the ranks of paired jobs (Ray and Spark) still on this machine."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"hvdlite.runner.paired" in cmd:
            found.append(int(pid))
    return found


def wait_for_no_paired_ranks(timeout: float = 20.0) -> list[int]:
    """Wait until no paired rank is left; the ones still there after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (left := paired_ranks()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def elastic_steps(steps: int, log_path: str, pause: float = 0.2) -> tuple[str, int, int]:
    """Elastic PyTorch training (``hvd.elastic.run``, a commit every step); rank 0 logs
    ``time step size`` after each step to ``log_path``. Returns (host, steps, size)."""
    import socket

    import torch

    import hvdlite.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            opt.zero_grad()
            model(torch.ones(8, 4)).sum().backward()
            opt.step()
            state.step += 1
            state.commit()
            if hvd.rank() == 0:
                with open(log_path, "a") as f:
                    f.write(f"{time.time()} {state.step} {hvd.size()}\n")
            time.sleep(pause)

    train(state)
    return socket.gethostname(), state.step, hvd.size()
