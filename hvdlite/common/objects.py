"""Python objects between ranks: ``broadcast_object`` and ``allgather_object``.

One implementation for every front end (each adds only its framework's arguments and
error types). Objects are pickled with cloudpickle, so lambdas, local classes and
objects defined in ``__main__`` travel by value, and sent as bytes in NumPy arrays:
no framework tensor is needed for them.
"""
from __future__ import annotations

import pickle
from typing import Any

import cloudpickle
import numpy as np

from hvdlite.common import ops as _ops
from hvdlite.common.basics import _load_core, rank


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """Return ``root_rank``'s ``obj`` on every rank (of ``process_set``): pickled on the
    root, unpickled on the others (the root gets its own object back). Two broadcasts:
    the length, then the bytes, named ``<name>.size`` and ``<name>.data``."""
    with _ops.process_set_scope(process_set):
        return _broadcast_object(obj, root_rank, name)


@_ops.blocking
def _broadcast_object(obj: Any, root_rank: int, name: str | None) -> Any:
    base = name if name is not None else _ops.auto_name("broadcast_object")
    root_rank = int(root_rank)
    is_root = rank() == root_rank
    payload = cloudpickle.dumps(obj) if is_root else b""
    length = np.array([len(payload)], np.int64)
    _ops.run(_ops.BROADCAST, length, None, "int64", name=f"{base}.size", root_rank=root_rank)
    data = np.frombuffer(payload, np.uint8).copy() if is_root else np.empty(int(length[0]), np.uint8)
    _ops.run(_ops.BROADCAST, data, None, "uint8", name=f"{base}.data", root_rank=root_rank)
    if is_root:
        return obj
    return pickle.loads(data)  # cloudpickle writes ordinary pickles


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Return the list of every rank's ``obj`` (of ``process_set``), in rank order
    (pickled with cloudpickle). Two allgathers: every rank's length, then the bytes,
    named ``<name>.size`` and ``<name>.data``."""
    with _ops.process_set_scope(process_set):
        return _allgather_object(obj, name)


@_ops.blocking
def _allgather_object(obj: Any, name: str | None) -> list[Any]:
    base = name if name is not None else _ops.auto_name("allgather_object")
    payload = np.frombuffer(cloudpickle.dumps(obj), np.uint8)
    lengths = _allgather_bytes(np.array([payload.size], np.int64), f"{base}.size").view(np.int64)
    data = _allgather_bytes(payload, f"{base}.data")
    out, offset = [], 0
    for n in lengths.tolist():
        out.append(pickle.loads(data[offset:offset + n]))
        offset += n
    assert len(out) == _ops.current_size()
    return out


def _allgather_bytes(arr: np.ndarray, name: str) -> np.ndarray:
    """Every rank's C-contiguous 1-D `arr`, concatenated, as the engine's uint8 bytes."""
    raw = _ops.RawTensor(_load_core().address(arr), _ops.NAME_OF_NP_DTYPE[arr.dtype], arr.shape)
    return _ops.submit(_ops.ALLGATHER, raw, name=name, keepalive=arr).output()[0]
