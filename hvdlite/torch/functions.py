"""Helpers that start every rank from the same state: parameters, optimizer state and
arbitrary picklable objects."""
from __future__ import annotations

from typing import Any

import torch

from hvdlite.common import objects as _objects, ops as _ops
from hvdlite.common.basics import rank
from hvdlite.torch.mpi_ops import broadcast_async_, synchronize


@_ops.blocking
def broadcast_parameters(params: Any, root_rank: int, process_set: Any = None) -> None:
    """Overwrite parameters (or any tensors) on every rank with their values on
    ``root_rank``, in place.

    ``params`` is a ``model.state_dict()``, the result of ``model.named_parameters()``,
    any dict or sequence of ``(name, tensor)`` pairs, or a sequence of tensors such as
    ``list(model.parameters())``. Named tensors are matched across ranks by name, bare
    tensors by their position in the sequence. Typical use, right after building the
    model::

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    with _ops.process_set_scope(process_set):
        if isinstance(params, dict):
            items = sorted(params.items(), key=lambda kv: str(kv[0]))
        else:
            items = []
            for i, it in enumerate(params):
                if isinstance(it, tuple) and len(it) == 2:
                    items.append(it)
                elif isinstance(it, torch.Tensor) or it is None:
                    items.append((f"[{i}]", it))  # a bare tensor is named by its position
                else:
                    raise ValueError("broadcast_parameters expects a dict, a sequence of "
                                     "(name, tensor) pairs or a sequence of tensors, e.g. "
                                     "model.state_dict(), model.named_parameters() or "
                                     f"list(model.parameters()); item {i} is a {type(it).__name__}")
        handles = []
        for name, p in items:
            if p is None:
                continue
            if not isinstance(p, torch.Tensor):
                raise ValueError(f"broadcast_parameters: {name!r} is a {type(p).__name__}, not a tensor")
            handles.append(broadcast_async_(p.data if isinstance(p, torch.nn.Parameter) else p,
                                            root_rank, name=f"broadcast_parameters.{name}"))
        for h in handles:
            synchronize(h)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: Any = None) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank (pickled with cloudpickle on the root,
    so lambdas and classes defined in ``__main__`` travel too; the root gets its own
    object back)."""
    with _ops.process_set_scope(process_set):
        return _objects.broadcast_object(obj, root_rank, name)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Return the list of every rank's ``obj``, in rank order (pickled with cloudpickle)."""
    with _ops.process_set_scope(process_set):
        return _objects.allgather_object(obj, name)


class _TensorSlot:
    """Placeholder for a tensor inside a pickled optimizer state. ``cuda``: the root's
    tensor is on a GPU, so every rank receives it on its own GPU (collectives need the
    same kind of memory on every rank; each rank's GPU index is its own)."""

    __slots__ = ("index", "shape", "dtype", "cuda")

    def __init__(self, index: int, shape: tuple[int, ...], dtype: torch.dtype, cuda: bool = False) -> None:
        self.index, self.shape, self.dtype, self.cuda = index, shape, dtype, cuda

    def __getstate__(self) -> tuple:
        return (self.index, self.shape, str(self.dtype).replace("torch.", ""), self.cuda)

    def __setstate__(self, state: tuple) -> None:
        self.index, self.shape, dt, self.cuda = state
        self.dtype = getattr(torch, dt)

    def empty(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device="cuda" if self.cuda else "cpu")


def _strip_tensors(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorSlot(len(tensors) - 1, tuple(obj.shape), obj.dtype, obj.is_cuda)
    if isinstance(obj, dict):
        return {k: _strip_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strip_tensors(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_strip_tensors(v, tensors) for v in obj)
    return obj


def _fill_tensors(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, _TensorSlot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _fill_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill_tensors(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_fill_tensors(v, tensors) for v in obj)
    return obj


@_ops.blocking
def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: Any = None, process_set: Any = None) -> None:
    """Make every rank's optimizer state (per-parameter state such as momentum buffers
    and Adam's moments, plus hyper-parameters such as the learning rate) equal to
    ``root_rank``'s.

    Works for any optimizer whose ``state_dict()``/``load_state_dict()`` round-trips,
    including state that exists on the root only because it has already taken steps
    (a freshly started rank receives it). Every rank must have built its optimizer over
    the same parameters in the same order. ``model`` is accepted for Horovod
    compatibility and not needed.
    """
    with _ops.process_set_scope(process_set):
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ValueError("cannot broadcast torch.optim.LBFGS state")
        if not optimizer.state:
            _zero_missing_gradients(optimizer)
        base = _ops.auto_name("broadcast_optimizer_state")
        if rank() == root_rank:
            sd = optimizer.state_dict()
            tensors: list[torch.Tensor] = []
            skeleton = _strip_tensors(sd, tensors)
        else:
            skeleton, tensors = None, []
        skeleton = broadcast_object(skeleton, root_rank, name=f"{base}.skeleton")
        if rank() != root_rank:
            slots: list[_TensorSlot] = []

            def collect(o: Any) -> None:
                if isinstance(o, _TensorSlot):
                    slots.append(o)
                elif isinstance(o, dict):
                    for v in o.values():
                        collect(v)
                elif isinstance(o, (list, tuple)):
                    for v in o:
                        collect(v)

            collect(skeleton)
            slots.sort(key=lambda s: s.index)
            tensors = [s.empty() for s in slots]
        handles = [broadcast_async_(t, root_rank, name=f"{base}.t{i}") for i, t in enumerate(tensors)]
        for h in handles:
            synchronize(h)
        if rank() != root_rank:
            optimizer.load_state_dict(_fill_tensors(skeleton, tensors))


def _zero_missing_gradients(optimizer: torch.optim.Optimizer) -> None:
    """What Horovod's broadcast_optimizer_state leaves on an optimizer that has no state
    yet: every trainable parameter without a gradient gets a zero one. (Horovod then
    takes a local step on them to create the state; hvdlite broadcasts the root's state
    whatever shape it has, so it skips that step and the changes it makes: weight decay
    moving the parameters and entering the momentum buffers, Adam counting a step.)"""
    for g in optimizer.param_groups:
        for p in g["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]
