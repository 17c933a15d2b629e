"""The engine's codes -- reduce ops, request kinds, element types -- and the element
types of NumPy, PyTorch and TensorFlow by the engine's name for them.

The numbers are read from the compiled core (its ``REDUCE_OPS``, ``REQUEST_TYPES``,
``DATA_TYPES`` and ``CPU_DEVICE``), where they are defined, instead of being copied
here by hand. Importing this module therefore loads the extension; that only maps it
and libmpi into the process, MPI itself starts at ``hvd.init()``.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from hvdlite.common.basics import _load_core

_core = _load_core()

# ---- reduce ops (Horovod's constants: hvd.Average, hvd.Sum, ...) --------------------------

REDUCE_OPS: dict[str, int] = dict(_core.REDUCE_OPS)
Average = REDUCE_OPS["Average"]
"""Reduce op: the sum divided by the number of ranks (the default of ``allreduce``)."""
Sum = REDUCE_OPS["Sum"]
"""Reduce op: the element-wise sum (integers wrap around, as in NumPy)."""
Adasum = REDUCE_OPS["Adasum"]
"""Reduce op: Adasum, which combines gradients by their angle (float tensors, a power-of-2
number of ranks; see docs/adasum.md)."""
Min = REDUCE_OPS["Min"]
"""Reduce op: the element-wise minimum."""
Max = REDUCE_OPS["Max"]
"""Reduce op: the element-wise maximum."""
Product = REDUCE_OPS["Product"]
"""Reduce op: the element-wise product (integers wrap around, as in NumPy)."""
OP_NAMES: dict[int, str] = {code: name for name, code in REDUCE_OPS.items()}
SUPPORTED_OPS = frozenset(REDUCE_OPS.values())

# ---- kinds of request -----------------------------------------------------------------

REQUEST_TYPES: dict[str, int] = dict(_core.REQUEST_TYPES)
ALLREDUCE = REQUEST_TYPES["allreduce"]
ALLGATHER = REQUEST_TYPES["allgather"]
BROADCAST = REQUEST_TYPES["broadcast"]
ALLTOALL = REQUEST_TYPES["alltoall"]
REDUCESCATTER = REQUEST_TYPES["reducescatter"]
BARRIER = REQUEST_TYPES["barrier"]
JOIN = REQUEST_TYPES["join"]
KIND_NAMES: dict[int, str] = {code: name for name, code in REQUEST_TYPES.items()}
# Kinds whose result the engine allocates (join: only the last rank, in ``aux``).
ENGINE_OUTPUT = frozenset((ALLGATHER, ALLTOALL, REDUCESCATTER, JOIN))

CPU_DEVICE: int = int(_core.CPU_DEVICE)  # the device of host memory

# ---- element types ----------------------------------------------------------------------

# The types the engine reduces: engine name -> code.
DTYPES: dict[str, int] = dict(_core.DATA_TYPES)
DTYPE_NAMES: dict[int, str] = {code: name for name, code in DTYPES.items()}
# Bytes per element. Every engine name ends in its width in bits (uint8 ... float64).
ITEMSIZE: dict[str, int] = {name: int(re.search(r"\d+$", name).group()) // 8 for name in DTYPES}


def _numpy_dtype(name: str) -> np.dtype | None:
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16: NumPy has none; ml_dtypes (shipped with TF/JAX) does
        try:
            import ml_dtypes
            return np.dtype(getattr(ml_dtypes, name))
        except (ImportError, AttributeError):
            return None


# NumPy: engine name <-> dtype. numpy's dtype.name is a slow Python property, and every
# collective call needs the name: the front ends look it up here. bfloat16 is missing
# when ml_dtypes is not installed (such arrays cannot exist then anyway).
NP_DTYPE_OF_NAME: dict[str, np.dtype] = {
    name: dt for name in DTYPES if (dt := _numpy_dtype(name)) is not None}
NAME_OF_NP_DTYPE: dict[np.dtype, str] = {dt: name for name, dt in NP_DTYPE_OF_NAME.items()}


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype of an engine element type (bfloat16 comes from ml_dtypes)."""
    dt = NP_DTYPE_OF_NAME.get(name)
    if dt is None:
        raise ImportError(f"{name} arrays need the ml_dtypes package (pip install ml_dtypes)")
    return dt


def framework_dtypes(framework: Any) -> dict[Any, str]:
    """``{dtype: engine name}`` for the types the engine reduces, of a framework whose
    dtypes are module attributes with the engine's names: ``framework_dtypes(torch)``
    maps ``torch.float32`` to ``"float32"``, ``framework_dtypes(tf)`` ``tf.float32``."""
    return {getattr(framework, name): name for name in DTYPES if hasattr(framework, name)}
