"""``hvd.elastic`` for PyTorch: Horovod's elastic-training API.

A script written for Horovod's elastic mode runs unchanged::

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, start=state.batch): ...
                state.sampler.record_batch(state.batch, batch_size)
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0
            state.sampler.set_epoch(state.epoch + 1)

    train(state)

``run`` makes every rank start from rank 0's model, optimizer, sampler position and
attributes; ``commit()`` keeps an in-memory copy that ``restore()`` returns to. Launched
elastic (``hvdlite-run --min-np ...``), training survives a lost worker: the survivors
go back to the last commit, rebuild the world among themselves and go on, and the
sampler reshards the epoch's remaining samples (see :mod:`hvdlite.common.elastic`).
"""
from __future__ import annotations

import copy
import math
import random
from typing import Any, Callable, Iterator

import torch

from hvdlite.common.basics import rank, size
from hvdlite.common.elastic import ObjectState, State, run_fn, sync_root
from hvdlite.torch.functions import (allgather_object, broadcast_object,
                                     broadcast_optimizer_state, broadcast_parameters)

__all__ = ["ElasticSampler", "TorchState", "State", "ObjectState", "run"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate the training function ``func(state, ...)``: every rank first takes rank
    0's ``state``, then runs ``func``; after a lost worker, the survivors restore the last
    commit, rebuild the world and call ``func`` again (:mod:`hvdlite.common.elastic`)."""
    return run_fn(func)


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset's indices over the ranks, like ``DistributedSampler``, and keeps
    track of the samples processed in the current epoch so that training resumed from a
    committed state does not repeat them.

    Each epoch the indices not yet processed are shuffled (``seed + epoch``, the same on
    every rank) when ``shuffle``; padded by repeating the first ones until every rank
    gets the same number; and rank ``r`` takes every ``size()``-th one starting at ``r``.
    Call ``record_batch(batch_idx, batch_size)`` after each batch (or ``record_indices``)
    and ``set_epoch(epoch)`` when a new epoch starts.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: nothing is processed yet, and the order is reshuffled."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark this rank's ``batch_idx``-th batch of ``batch_size`` samples as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Any) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's dataset indices of its ``batch_idx``-th batch of ``batch_size``."""
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Recompute this rank's share from the indices not yet processed this epoch."""
        self.num_replicas = size()
        self.rank = rank()
        remaining = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(remaining)
        self.remaining_indices = remaining
        self.num_samples = math.ceil(len(remaining) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        padded = list(remaining)
        while padded and len(padded) < self.total_size:
            padded += padded[:self.total_size - len(padded)]
        self.indices = padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples


class _Handler:
    """Saves, restores and syncs one stateful object of a ``TorchState``."""

    def __init__(self, value: Any) -> None:
        self.set_value(value)

    def set_value(self, value: Any) -> None:
        # A local copy, never a collective: a worker that joins a running job builds
        # its state alone, before its first sync.
        self.value = value
        self._saved = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=sync_root()))


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=sync_root())


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=sync_root())


class _SamplerHandler(_Handler):
    def save(self) -> None:
        # What every rank processed since the epoch began, so that a restored sampler
        # skips all of it whichever rank did it.
        state = self.value.state_dict()
        if size() > 1:
            state["processed_indices"] = set().union(*allgather_object(state["processed_indices"]))
        self._saved = copy.deepcopy(state)


_LRScheduler = getattr(torch.optim.lr_scheduler, "LRScheduler",
                       getattr(torch.optim.lr_scheduler, "_LRScheduler", None))

# Which handler an attribute of a TorchState gets, by the type of its value; anything
# else is a plain Python value (ObjectState).
_HANDLERS: list[tuple[type, type[_Handler]]] = [
    (torch.nn.Module, _ModelHandler),
    (torch.optim.Optimizer, _OptimizerHandler),
    (ElasticSampler, _SamplerHandler),
] + ([(_LRScheduler, _Handler)] if _LRScheduler is not None else [])


class TorchState(ObjectState):
    """The state of a PyTorch training process: ``model``, ``optimizer`` and any further
    keyword arguments, all exposed as attributes. Modules, optimizers, learning-rate
    schedulers and ``ElasticSampler`` s are saved through their ``state_dict`` and synced
    from the sync root (parameters and buffers, optimizer state, scheduler state, the union of
    processed samples); other values are plain Python values."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, _Handler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            cls = next((h for t, h in _HANDLERS if isinstance(value, t)), None)
            if cls is None:
                plain[name] = value
            else:
                handlers[name] = cls(value)
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=lambda obj: broadcast_object(obj, root_rank=sync_root()),
                         get_rank=rank, **plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handler = self.__dict__.get("_handlers", {}).get(name)
        if handler is not None:
            handler.set_value(value)  # a new model/optimizer: it becomes the saved one
        object.__setattr__(self, name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()
