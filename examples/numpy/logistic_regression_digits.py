"""Data-parallel softmax (multinomial logistic) regression in plain NumPy with hvdlite.

Data: scikit-learn's bundled handwritten digits (``sklearn.datasets.load_digits``:
1,797 8x8 images, 10 classes) -- shipped inside the package, nothing is downloaded.
Features are standardized with the training set's mean and spread; the train/test split
is fixed by a seed.

Data parallelism: each step takes one *global* batch (``--batch-size`` samples, the
same on every rank, drawn from a shuffle that every rank computes from the same seed)
and every rank computes the gradient of its own slice of that batch. Each rank scales
its summed per-sample gradient by ``size / batch_len``, so that ``hvd.allreduce(...,
op=hvd.Average)`` -- the sum over ranks divided by ``size`` -- is exactly the mean
gradient over the whole global batch, however the batch is split (uneven slices and a
shorter last batch included). Every rank then takes the same SGD step, so the result
does not depend on the number of ranks. Rank 0's initial weights are broadcast to all.

Run::

    mpirun -np 2 python examples/numpy/logistic_regression_digits.py
    python examples/numpy/logistic_regression_digits.py --reference   # one process, no hvdlite

Rank 0 prints the training loss after each epoch and finally
``final test accuracy: 0.9xxx``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np

NUM_CLASSES = 10


@dataclass
class Data:
    """Standardized train and test sets."""
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_data(seed: int, test_fraction: float = 0.2) -> Data:
    """Digits, split with a fixed seed (stratified), standardized on the training set."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x.astype(np.float64), y.astype(np.int64), test_size=test_fraction,
        random_state=seed, stratify=y)
    mean = x_tr.mean(axis=0)
    std = x_tr.std(axis=0)
    std[std == 0] = 1.0  # border pixels that are always blank
    return Data((x_tr - mean) / std, y_tr, (x_te - mean) / std, y_te)


class SingleProcess:
    """The ``--reference`` stand-in for hvdlite: one process sees every sample."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def average(self, array: np.ndarray, name: str) -> np.ndarray:
        return array

    def total(self, array: np.ndarray, name: str) -> np.ndarray:
        return array

    def from_rank0(self, array: np.ndarray, name: str) -> np.ndarray:
        return array


class DataParallel:
    """The few hvdlite calls this example needs."""

    def __init__(self) -> None:
        import hvdlite as hvd
        hvd.init()
        self.hvd = hvd

    def rank(self) -> int:
        return self.hvd.rank()

    def size(self) -> int:
        return self.hvd.size()

    def average(self, array: np.ndarray, name: str) -> np.ndarray:
        return self.hvd.allreduce(array, name=name, op=self.hvd.Average)

    def total(self, array: np.ndarray, name: str) -> np.ndarray:
        return self.hvd.allreduce(array, name=name, op=self.hvd.Sum)

    def from_rank0(self, array: np.ndarray, name: str) -> np.ndarray:
        return self.hvd.broadcast(array, 0, name=name)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def summed_gradient(w: np.ndarray, b: np.ndarray, x: np.ndarray,
                    y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradient of the cross-entropy *summed* (not averaged) over the rows of ``x``."""
    delta = softmax(x @ w + b)
    delta[np.arange(len(y)), y] -= 1.0
    return x.T @ delta, delta.sum(axis=0)


def evaluate(comm: Any, w: np.ndarray, b: np.ndarray, x: np.ndarray,
             y: np.ndarray, tag: str) -> tuple[float, float]:
    """Mean cross-entropy and accuracy over ``x``; each rank scores its slice."""
    mine = np.array_split(np.arange(len(y)), comm.size())[comm.rank()]
    probs = softmax(x[mine] @ w + b)
    loss_sum = -np.log(np.maximum(probs[np.arange(len(mine)), y[mine]], 1e-300)).sum()
    correct = float((probs.argmax(axis=1) == y[mine]).sum())
    totals = comm.total(np.array([loss_sum, correct], np.float64), name=f"eval.{tag}")
    return float(totals[0] / len(y)), float(totals[1] / len(y))


def train(comm: Any, data: Data, epochs: int, lr: float, batch_size: int,
          seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """SGD on global batches split across ranks; returns weights, bias, test accuracy."""
    rank, size = comm.rank(), comm.size()
    n_features = data.x_train.shape[1]
    w = np.random.default_rng(seed).normal(0.0, 0.01, (n_features, NUM_CLASSES))
    b = np.zeros(NUM_CLASSES)
    if rank != 0:
        w = np.zeros_like(w)  # overwritten by rank 0's values
    w = comm.from_rank0(w, name="init.w")
    b = comm.from_rank0(b, name="init.b")

    n = len(data.y_train)
    for epoch in range(1, epochs + 1):
        order = np.random.default_rng([seed, epoch]).permutation(n)  # same on every rank
        for start in range(0, n, batch_size):
            batch = order[start:start + batch_size]
            mine = np.array_split(batch, size)[rank]
            g_w, g_b = summed_gradient(w, b, data.x_train[mine], data.y_train[mine])
            scale = size / len(batch)  # Average over ranks then equals the batch mean
            g_w = comm.average(g_w * scale, name="grad.w")
            g_b = comm.average(g_b * scale, name="grad.b")
            w -= lr * g_w
            b -= lr * g_b
        loss, acc = evaluate(comm, w, b, data.x_train, data.y_train, "train")
        if rank == 0:
            print(f"epoch {epoch:3d}  train loss {loss:.5f}  train accuracy {acc:.4f}",
                  flush=True)
    _, test_acc = evaluate(comm, w, b, data.x_test, data.y_test, "test")
    return w, b, test_acc


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    p.add_argument("--batch-size", type=int, default=60,
                   help="global batch size, split across the ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reference", action="store_true",
                   help="train in this one process with plain NumPy, without hvdlite")
    p.add_argument("--save-weights", metavar="F.npy",
                   help="rank 0 saves the final weights and bias (flattened) here")
    args = p.parse_args(argv)

    comm: Any = SingleProcess() if args.reference else DataParallel()
    data = load_data(args.seed)
    if comm.rank() == 0:
        mode = "reference (one process, no hvdlite)" if args.reference else \
            f"hvdlite data parallel on {comm.size()} rank(s)"
        print(f"{mode}: {len(data.y_train)} train / {len(data.y_test)} test samples, "
              f"global batch {args.batch_size}, lr {args.lr}, {args.epochs} epochs", flush=True)
    w, b, test_acc = train(comm, data, args.epochs, args.lr, args.batch_size, args.seed)
    if comm.rank() == 0:
        if args.save_weights:
            np.save(args.save_weights, np.concatenate([w.ravel(), b]))
        print(f"final test accuracy: {test_acc:.4f}", flush=True)
    if not args.reference:
        comm.hvd.shutdown()


if __name__ == "__main__":
    main()
