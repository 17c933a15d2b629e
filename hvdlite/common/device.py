"""GPU memory in the framework-neutral layer: reading the two standard descriptions of
a device array, and the array type hvdlite returns for GPU results.

* ``__cuda_array_interface__`` (CuPy, Numba, PyTorch, ...): pointer, shape, type
  string, strides and, since version 3, the ``stream`` whose work produces the data.
* ``__dlpack__`` / ``__dlpack_device__`` (the array API standard; JAX, TensorFlow,
  PyTorch, CuPy, ...): a capsule that names the memory, asked for with the stream the
  consumer will read on.

A collective on such an array is ordered after the producer's stream (an event recorded
on it when the collective is submitted) and never waits on the host. Its result is a
:class:`DeviceArray`, which exposes both interfaces, so any of those libraries takes it
without a copy; consumers that follow the protocols (CuPy, Numba, PyTorch's
``torch.as_tensor``/``from_dlpack``) order their own stream after hvdlite's.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from hvdlite.common import basics as _basics, codes as _codes

# CUDA's special stream handles, as the interfaces use them.
LEGACY_DEFAULT_STREAM = 1
PER_THREAD_DEFAULT_STREAM = 2
_DLPACK_CUDA = 2


class DeviceView(NamedTuple):
    """A device array as the engine sees it."""
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    device: int
    stream: int | None  # the producer's stream; None: already complete, no ordering needed
    readonly: bool
    owner: Any          # keeps the memory alive while a collective uses it


def is_device_array(obj: Any) -> bool:
    """True for objects that describe GPU memory (and are not NumPy arrays)."""
    if isinstance(obj, np.ndarray):
        return False
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return int(dev()[0]) == _DLPACK_CUDA
    except Exception:  # noqa: BLE001 - not a usable DLPack producer: not a device array
        return False


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def view(obj: Any, core: Any) -> tuple[DeviceView | None, str | None]:
    """``(view, None)`` for a usable C-contiguous device array, ``(None, problem)`` if it
    cannot be used. The device comes from the CUDA runtime (``cudaPointerGetAttributes``)."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(obj, cai, core)
    return _from_dlpack(obj, core)


def _from_cai(obj: Any, cai: dict[str, Any], core: Any) -> tuple[DeviceView | None, str | None]:
    try:
        shape = tuple(int(d) for d in cai["shape"])
        dtype = np.dtype(cai["typestr"])
        ptr, readonly = cai["data"]
    except Exception as exc:  # noqa: BLE001 - a malformed interface is the caller's problem
        return None, f"its __cuda_array_interface__ cannot be read: {exc!r}"
    if cai.get("mask") is not None:
        return None, "masked device arrays (a 'mask' in __cuda_array_interface__) are not supported"
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _contiguous_strides(shape, dtype.itemsize) and \
            int(np.prod(shape)) > 1:
        return None, "the device array is not C-contiguous (make a contiguous copy first)"
    stream = cai.get("stream") if int(cai.get("version", 0)) >= 3 else None
    if stream == 0:
        return None, "__cuda_array_interface__ 'stream' 0 is ambiguous (the protocol forbids it)"
    ptr = int(ptr or 0)
    device = _device_of(ptr, core) if ptr else 0
    if isinstance(device, str):
        return None, device
    return DeviceView(ptr, shape, dtype, device, None if stream is None else int(stream), bool(readonly), obj), None


def _from_dlpack(obj: Any, core: Any) -> tuple[DeviceView | None, str | None]:
    try:
        kind, device = (int(v) for v in obj.__dlpack_device__())
        if kind != _DLPACK_CUDA:
            return None, f"DLPack device type {kind} is not CUDA"
        capsule = obj.__dlpack__(stream=LEGACY_DEFAULT_STREAM)
        ptr, shape, typestr, contiguous = core.dlpack_describe(capsule)
        dtype = _codes.np_dtype("bfloat16") if typestr == "bfloat16" else np.dtype(typestr)
    except Exception as exc:  # noqa: BLE001
        return None, f"it cannot be read through DLPack: {exc!r}"
    if not contiguous:
        return None, "the device array is not C-contiguous (make a contiguous copy first)"
    # The producer ordered its work before the legacy default stream (as asked above).
    return DeviceView(int(ptr), tuple(shape), dtype, device, LEGACY_DEFAULT_STREAM, False, (obj, capsule)), None


def _device_of(ptr: int, core: Any) -> int | str:
    try:
        return int(core.device_of_pointer(ptr))
    except Exception as exc:  # noqa: BLE001 - reported as a refusal of the collective
        return f"hvdlite cannot use GPU memory here: {exc}"


class DeviceArray:
    """A result of hvdlite in GPU memory.

    It is produced on hvdlite's own stream of the device, which its
    ``__cuda_array_interface__`` names, and ``__dlpack__(stream=...)`` orders the
    consumer's stream after it; so CuPy (``cupy.asarray``), Numba
    (``numba.cuda.as_cuda_array``), PyTorch (``torch.from_dlpack``) and JAX take it
    without a copy and without waiting on the host. :meth:`get` copies it to a NumPy
    array. The memory is freed when the last reference goes, after the work of the
    streams it was handed to.
    """

    __slots__ = ("_result", "shape", "dtype", "__weakref__")

    def __init__(self, result: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self._result = result
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)

    @classmethod
    def from_numpy(cls, array: Any, device: int) -> "DeviceArray":
        """A copy of `array` on GPU `device` (the host waits for the copy). Needs
        ``hvd.init()`` first: the memory comes from hvdlite's stream of the device."""
        host = np.ascontiguousarray(array)
        name = _codes.NAME_OF_NP_DTYPE.get(host.dtype)
        if name is None:
            raise TypeError(f"unsupported dtype {host.dtype}; hvdlite supports {', '.join(_codes.DTYPES)}")
        core = _basics.core()
        result = core.allocate_device(int(device), host.nbytes, list(host.shape), _codes.DTYPES[name])
        core.copy_host_to_device(host.reshape(-1).view(np.uint8), int(result.ptr), int(device), int(result.stream))
        return cls(result, host.shape, host.dtype)

    @property
    def device(self) -> int:
        return int(self._result.device)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def ptr(self) -> int:
        return int(self._result.ptr)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": int(self._result.stream)}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CUDA, self.device)

    def __dlpack__(self, *, stream: int | None = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        core = _basics._load_core()
        consumer = LEGACY_DEFAULT_STREAM if stream is None else int(stream)
        if consumer != -1:  # -1: the consumer asks for no ordering
            core.order_stream_after(self.device, consumer, int(self._result.stream))
            self._result.used_on(consumer)
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError("hvdlite's device arrays can only be exported on their own device")
        if copy:
            raise BufferError("hvdlite's device arrays are exported without a copy")
        return self._result.to_dlpack(list(self.shape), _codes.DTYPES[_codes.NAME_OF_NP_DTYPE[self.dtype]])

    def get(self) -> np.ndarray:
        """A NumPy copy (waits for hvdlite's work on the device)."""
        out = np.empty(self.shape, self.dtype)
        _basics._load_core().copy_device_to_host(self.ptr, out.reshape(-1).view(np.uint8), self.device,
                                                int(self._result.stream))
        return out

    copy_to_host = get  # Numba's name

    def __repr__(self) -> str:
        return f"hvdlite.DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device})"
