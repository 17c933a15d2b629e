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
import random
import warnings
from typing import Any, Callable, Iterator

import torch

from hvdlite.common.basics import rank, size
from hvdlite.common.elastic import ObjectState, State, run_fn, sync_root
from hvdlite.torch import uneven
from hvdlite.torch.onebit import OneBitAdam
from hvdlite.torch.zero import ZeroRedundancyOptimizer
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
    every rank) when ``shuffle``, and rank ``r`` takes every ``size()``-th one starting
    at ``r``: every sample goes to exactly one rank, so shares differ by at most one.
    Call ``record_batch(batch_idx, batch_size)`` after each batch (or ``record_indices``)
    and ``set_epoch(epoch)`` when a new epoch starts.

    Unlike Horovod's sampler, which pads the shorter shares with repeated samples, no
    sample is trained twice in an epoch. When the one extra sample would give some
    ranks one more batch than the others, each of the others gets a one-sample padding
    batch so that all ranks run the same steps; ``DistributedOptimizer`` gives that
    batch's gradient no weight (the step averages over the ranks with real data,
    :mod:`hvdlite.torch.uneven`), and ``record_batch`` does not count it. The batch size
    is learnt from the first ``record_batch``; before it, each shorter share is padded
    with one sample, which the first ``record_batch`` takes back unless it is needed.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.indices: list[int] = []
        self.batch_size: int | None = None  # learnt from record_batch
        self._real = 0          # indices[:_real] are this rank's share, the rest padding
        self._handed_out = 0    # how many indices the current iteration has yielded
        self._tail: tuple[int, int] | None = None  # (padding batch, ranks with data in it)
        self._step_base = 0
        self.reset()
        uneven.register(self)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: nothing is processed yet, and the order is reshuffled."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark this rank's ``batch_idx``-th batch of ``batch_size`` samples as processed."""
        if self.batch_size != batch_size:
            self.batch_size = int(batch_size)
            self._place_padding()
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Any) -> None:
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's dataset indices of its ``batch_idx``-th batch of ``batch_size``
        (without the padding sample, which is not processed)."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, self._real)]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices),
                "batch_size": self.batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.batch_size = state_dict.get("batch_size", self.batch_size)
        self.reset()

    def reset(self) -> None:
        """Recompute this rank's share from the indices not yet processed this epoch."""
        self.num_replicas = size()
        self.rank = rank()
        remaining = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(remaining)
        self.remaining_indices = remaining
        self.indices = remaining[self.rank::self.num_replicas]
        self._real = len(self.indices)
        self._handed_out = 0
        self._step_base = uneven.steps()
        self._place_padding()

    def _place_padding(self) -> None:
        """Pad this rank's share with one sample when other ranks have one batch more
        (or, batch size unknown, one sample more); take back a padding no longer needed
        if the current iteration has not handed it out yet."""
        total, n = len(self.remaining_indices), self.num_replicas
        q, longer = divmod(total, n)  # ranks 0..longer-1 have q + 1 samples, the rest q
        b = self.batch_size
        needed = longer > 0 and (b is None or q % b == 0)
        self._tail = (q // b, longer) if needed and b is not None else None
        padded = len(self.indices) > self._real
        if needed and self.rank >= longer and not padded:
            self.indices.append(self.remaining_indices[self.rank if q else 0])
        elif padded and not (needed and self.rank >= longer) and self._handed_out <= self._real:
            del self.indices[self._real:]

    def step_weight(self, steps_taken: int) -> tuple[float, int] | None:
        """:mod:`hvdlite.torch.uneven`: this rank's weight in the step now running and how
        many ranks have data in it, for the padding batch's step; None for the others."""
        if self._tail is None or steps_taken - self._step_base != self._tail[0]:
            return None
        return (1.0 if self.rank < self._tail[1] else 0.0), self._tail[1]

    def __iter__(self) -> Iterator[int]:
        # By position, so that padding placed or taken back by the first record_batch
        # applies to an iteration already under way.
        self._handed_out = 0
        while self._handed_out < len(self.indices):
            self._handed_out += 1
            yield self.indices[self._handed_out - 1]

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def num_samples(self) -> int:
        return len(self.indices)


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
        # A copy: an optimizer's load_state_dict keeps the tensors it is given as its
        # state, and its next step would change the commit in place.
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=sync_root()))


class _ModelHandler(_Handler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=sync_root())


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=sync_root())


class _OneBitHandler(_OptimizerHandler):
    """``OneBitAdam``: Adam's moments are the same on every rank and come from the sync
    root; the error-feedback buffers are each rank's own, so they are kept (the world
    unchanged) or laid out again for the new world, never taken from the root."""

    def sync(self) -> None:
        own = self.value._error_feedback_state()
        with warnings.catch_warnings():     # the root's buffers are not loaded: no warning
            warnings.filterwarnings("ignore", message="OneBitAdam")
            super().sync()
        self.value._follow_world(own)


class _ZeroHandler(_Handler):
    """A ``ZeroRedundancyOptimizer``: its live state is sharded, so a rank that dies takes
    its share with it. A commit therefore keeps the whole state (every share, gathered,
    on the CPU) on every rank, with the whole parameters at stage 3 (where the model's
    are freed between uses), and a sync after a reset shards the optimizer again over
    the new world and loads that state into it."""

    def set_value(self, value: Any) -> None:
        # Not a collective (a joining worker builds its state alone): until the first
        # sync, only this rank's share, and at stage 3 its shards of the parameters.
        self.value = value
        self._saved: dict[str, Any] | None = None
        self._initial = (copy.deepcopy(value.optim.state_dict()),
                         [f.master.detach().clone() for fs in value._flats for f in fs] if value.stage == 3 else [])

    def save(self) -> None:
        self._saved = self.value._elastic_state()

    def restore(self) -> None:
        zero = self.value
        if self._saved is None:
            if zero._fits_world():
                optim, shards = copy.deepcopy(self._initial)
                if zero.stage == 3:
                    zero._release_all()
                    zero._load_shards(shards)
                zero.optim.load_state_dict(optim)
        elif zero._fits_world():
            zero._load_elastic_state(self._saved)
        # else: the world changed since the commit; sync() shards again and loads it

    def sync(self) -> None:
        zero = self.value
        # The sync root's last whole state; before any rank has one (the first sync),
        # the live shards, which every rank still holds for the same world.
        have = allgather_object(self._saved is not None, name="hvdlite.elastic.zero.have")
        root = sync_root()
        src = root if have[root] else next((r for r, h in enumerate(have) if h), None)
        if src is None:
            if zero.stage == 3 and not zero._fits_world():
                raise RuntimeError("a worker was lost before the first commit of a ZeroRedundancyOptimizer at "
                                   "stage 3, with its shard of the parameters: nothing holds them whole; "
                                   "commit once the state is built (hvd.elastic.run's first sync does)")
            whole = zero._elastic_state()
        else:
            whole = broadcast_object(self._saved if rank() == src else None, root_rank=src,
                                     name="hvdlite.elastic.zero.state")
        # Shard again even where this rank's number and the world's size are the same:
        # gradients in flight when the old world failed are dropped with its buckets.
        zero._reshard(whole["params"])
        zero._load_elastic_state(whole)
        self._saved = whole


class _SamplerHandler(_Handler):
    def save(self) -> None:
        # What every rank processed since the epoch began, so that a restored sampler
        # skips all of it whichever rank did it.
        state = self.value.state_dict()
        if size() > 1:
            state["processed_indices"] = set().union(*allgather_object(state["processed_indices"]))
        self._saved = copy.deepcopy(state)

    def sync(self) -> None:
        # Every rank's processed samples of the sync root's epoch: after a restore they
        # are the commits' (a subset of the root's), but after workers were added the
        # samplers were not restored and each holds only what its own rank processed.
        state = self.value.state_dict()
        if size() > 1:
            gathered = allgather_object((state["epoch"], state["processed_indices"]))
            epoch = gathered[sync_root()][0]
            state["processed_indices"] = set().union(*(p for e, p in gathered if e == epoch))
        self.value.load_state_dict(broadcast_object(state, root_rank=sync_root()))


_LRScheduler = getattr(torch.optim.lr_scheduler, "LRScheduler",
                       getattr(torch.optim.lr_scheduler, "_LRScheduler", None))

# Which handler an attribute of a TorchState gets, by the type of its value; anything
# else is a plain Python value (ObjectState).
_HANDLERS: list[tuple[type, type[_Handler]]] = [
    (torch.nn.Module, _ModelHandler),
    (ZeroRedundancyOptimizer, _ZeroHandler),     # these two before Optimizer, which they also are
    (OneBitAdam, _OneBitHandler),
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
        # A ZeroRedundancyOptimizer first: at stage 3 it frees the parameters that the
        # failed step had gathered, so that the model's state dict has the saved shape.
        for handler in sorted(self._handlers.values(), key=lambda h: not isinstance(h, _ZeroHandler)):
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def snapshot(self) -> Any:
        return {**super().snapshot(), "objects": {name: h._saved for name, h in self._handlers.items()}}

    def load_snapshot(self, snapshot: Any) -> None:
        objects = snapshot["objects"]
        if set(objects) != set(self._handlers):
            raise ValueError(f"the last commit holds {sorted(objects)}, this TorchState "
                             f"{sorted(self._handlers)}: the script must build the same state")
        for name, handler in self._handlers.items():
            handler._saved = objects[name]
            handler.restore()
        super().load_snapshot(snapshot)
