"""A training function for hvdlite's function launchers: the same function runs on N
ranks through ``hvdlite.run`` (``run_digits_function.py``), Ray's ``RayExecutor``
(``examples/ray``) and ``hvdlite.spark.run`` (``examples/spark``).

It trains a small MLP on scikit-learn's bundled digits images (no download) with
``hvd.DistributedOptimizer``, each rank on its own shard of every batch, and returns
this rank's view of the result: the test accuracy and the trained parameters, the same
on every rank and, for the same seed and number of ranks, the same through every
launcher (up to float rounding: where tensor fusion packs gradients together depends
on timing, and with it the order in which a ring allreduce adds them).
"""
from __future__ import annotations

from typing import Any


def train(epochs: int = 10, lr: float = 0.05, batch_size: int = 64, seed: int = 0) -> dict[str, Any]:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import hvdlite.torch as hvd

    hvd.init()
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data.astype(np.float32) / 16.0, digits.target, test_size=0.2, random_state=seed)
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).double()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr * hvd.size()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x_train), generator=generator)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            # Every rank takes its own slice of the same global batch.
            batch = order[start:start + batch_size][hvd.rank()::hvd.size()]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[batch].double()), y_train[batch])
            loss.backward()
            optimizer.step()

    with torch.no_grad():
        accuracy = (model(x_test.double()).argmax(1) == y_test).double().mean().item()
    parameters = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    return {"rank": hvd.rank(), "size": hvd.size(), "accuracy": accuracy, "parameters": parameters}


def report(results: list[dict[str, Any]], launcher: str, save: str | None = None) -> None:
    """Print what every launcher's script prints; save rank 0's parameters (``.npy``)."""
    import numpy as np

    first = results[0]
    print(f"accuracy {first['accuracy']:.4f} parameter sum {first['parameters'].sum():.8f} "
          f"({len(results)} ranks, {launcher})")
    if save:
        np.save(save, first["parameters"])
