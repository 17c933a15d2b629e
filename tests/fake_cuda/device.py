"""ctypes helpers over the fake CUDA runtime (``OUTDIR/libcudart.so`` from build.sh).

For tests that hand "device" arrays to code under test: :class:`FakeDeviceArray` owns
cudaMalloc memory and exposes ``__cuda_array_interface__`` (version 3), including the
stream its data was written on, and :func:`cai_to_numpy` reads any such object back
honouring that stream. Call :func:`load` once first (or set HVDLITE_CUDART_LIBRARY).
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Optional

import numpy as np

cudaMemcpyHostToDevice = 1
cudaMemcpyDeviceToHost = 2
cudaMemcpyDeviceToDevice = 3
cudaErrorNotReady = 600
cudaStreamNonBlocking = 0x1
cudaEventDisableTiming = 0x2

_lib: Optional[ctypes.CDLL] = None

_P = ctypes.c_void_p
_SIGNATURES = {
    "cudaGetDeviceCount": [ctypes.POINTER(ctypes.c_int)],
    "cudaSetDevice": [ctypes.c_int],
    "cudaGetDevice": [ctypes.POINTER(ctypes.c_int)],
    "cudaMalloc": [ctypes.POINTER(_P), ctypes.c_size_t],
    "cudaFree": [_P],
    "cudaMallocAsync": [ctypes.POINTER(_P), ctypes.c_size_t, _P],
    "cudaFreeAsync": [_P, _P],
    "cudaMallocHost": [ctypes.POINTER(_P), ctypes.c_size_t],
    "cudaFreeHost": [_P],
    "cudaMemcpy": [_P, _P, ctypes.c_size_t, ctypes.c_int],
    "cudaMemcpyAsync": [_P, _P, ctypes.c_size_t, ctypes.c_int, _P],
    "cudaMemsetAsync": [_P, ctypes.c_int, ctypes.c_size_t, _P],
    "cudaStreamCreate": [ctypes.POINTER(_P)],
    "cudaStreamCreateWithFlags": [ctypes.POINTER(_P), ctypes.c_uint],
    "cudaStreamDestroy": [_P],
    "cudaStreamSynchronize": [_P],
    "cudaStreamQuery": [_P],
    "cudaStreamWaitEvent": [_P, _P, ctypes.c_uint],
    "cudaEventCreate": [ctypes.POINTER(_P)],
    "cudaEventCreateWithFlags": [ctypes.POINTER(_P), ctypes.c_uint],
    "cudaEventRecord": [_P, _P],
    "cudaEventQuery": [_P],
    "cudaEventSynchronize": [_P],
    "cudaEventDestroy": [_P],
    "cudaEventElapsedTime": [ctypes.POINTER(ctypes.c_float), _P, _P],
    "cudaLaunchHostFunc": [_P, _P, _P],
    "cudaPointerGetAttributes": [_P, _P],
    "cudaGetLastError": [],
    "cudaPeekAtLastError": [],
    "cudaRuntimeGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "cudaDriverGetVersion": [ctypes.POINTER(ctypes.c_int)],
    "cudaDeviceSynchronize": [],
}


class CudaError(RuntimeError):
    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} failed: {error_string(code)} ({code})")
        self.code = code


def load(outdir: Optional[str] = None) -> ctypes.CDLL:
    """Loads OUTDIR/libcudart.so (default: $HVDLITE_CUDART_LIBRARY) and returns it."""
    global _lib
    if outdir is None:
        path = os.environ.get("HVDLITE_CUDART_LIBRARY")
        if not path:
            raise RuntimeError("load(outdir) first, or set HVDLITE_CUDART_LIBRARY")
    else:
        path = os.path.join(os.fspath(outdir), "libcudart.so")
    lib = ctypes.CDLL(path)
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    for name in ("cudaGetErrorString", "cudaGetErrorName"):
        getattr(lib, name).argtypes = [ctypes.c_int]
        getattr(lib, name).restype = ctypes.c_char_p
    _lib = lib
    return lib


def lib() -> ctypes.CDLL:
    return _lib if _lib is not None else load()


def error_string(code: int) -> str:
    return lib().cudaGetErrorString(code).decode()


def check(code: int, what: str) -> None:
    if code != 0:
        raise CudaError(what, code)


def _handle(stream: Optional[int]) -> Optional[int]:
    """A stream as ctypes wants it: None (the legacy default stream, 0) or an int."""
    return None if not stream else int(stream)


def create_stream(non_blocking: bool = False) -> int:
    s = _P()
    check(lib().cudaStreamCreateWithFlags(ctypes.byref(s), cudaStreamNonBlocking if non_blocking else 0),
          "cudaStreamCreateWithFlags")
    return int(s.value)


def destroy_stream(stream: int) -> None:
    check(lib().cudaStreamDestroy(_handle(stream)), "cudaStreamDestroy")


def stream_synchronize(stream: Optional[int]) -> None:
    check(lib().cudaStreamSynchronize(_handle(stream)), "cudaStreamSynchronize")


def create_event(timing: bool = False) -> int:
    e = _P()
    check(lib().cudaEventCreateWithFlags(ctypes.byref(e), 0 if timing else cudaEventDisableTiming),
          "cudaEventCreateWithFlags")
    return int(e.value)


def record_event(event: int, stream: Optional[int]) -> None:
    check(lib().cudaEventRecord(event, _handle(stream)), "cudaEventRecord")


def stream_wait_event(stream: Optional[int], event: int) -> None:
    check(lib().cudaStreamWaitEvent(_handle(stream), event, 0), "cudaStreamWaitEvent")


def destroy_event(event: int) -> None:
    check(lib().cudaEventDestroy(event), "cudaEventDestroy")


def memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: Optional[int]) -> None:
    check(lib().cudaMemcpyAsync(dst, src, nbytes, kind, _handle(stream)), "cudaMemcpyAsync")


class FakeDeviceArray:
    """A C-contiguous array in (fake) device memory from cudaMalloc.

    ``stream`` is the stream its contents were last written on; ``__cuda_array_interface__``
    reports it, so a consumer must order its reads after that stream's work.
    """

    def __init__(self, shape, dtype, stream: Optional[int] = None) -> None:
        self.shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.stream = stream
        self._own_stream: Optional[int] = None
        self._keepalive: Any = None  # a host source still being copied from
        p = _P()
        check(lib().cudaMalloc(ctypes.byref(p), self.nbytes), "cudaMalloc")
        self.ptr = int(p.value or 0)

    @classmethod
    def from_numpy(cls, arr, stream: Optional[int] = None, delay_write: bool = True) -> "FakeDeviceArray":
        """Uploads ``arr`` with cudaMemcpyAsync on ``stream`` (default: a new stream owned by
        the array). With ``delay_write`` (default) nothing waits for the copy: the data lands
        after the stream's delay, and consumers must honour the interface's ``stream``. With
        ``delay_write=False`` the stream is synchronized and ``stream`` is reported as None."""
        host = np.ascontiguousarray(arr)
        out = cls(host.shape, host.dtype)
        if stream is None:
            stream = out._own_stream = create_stream()
        out.stream = stream
        out._keepalive = host
        if out.nbytes:
            memcpy_async(out.ptr, host.ctypes.data, out.nbytes, cudaMemcpyHostToDevice, stream)
        if not delay_write:
            stream_synchronize(stream)
            out.stream = None
        return out

    @property
    def __cuda_array_interface__(self) -> dict:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": None if self.stream is None else int(self.stream),
        }

    def to_numpy(self, stream: Optional[int] = None) -> np.ndarray:
        """Downloads with cudaMemcpyAsync on ``stream`` (default: the array's stream, else the
        legacy default stream), then synchronizes that stream."""
        if stream is None:
            stream = self.stream
        out = np.empty(self.shape, self.dtype)
        if self.nbytes:
            memcpy_async(out.ctypes.data, self.ptr, self.nbytes, cudaMemcpyDeviceToHost, stream)
        stream_synchronize(stream)
        return out

    def free(self) -> None:
        """Frees the memory (cudaFree waits for the device's work) and the owned stream."""
        if self.ptr:
            check(lib().cudaFree(self.ptr), "cudaFree")
            self.ptr = 0
        if self._own_stream is not None:
            destroy_stream(self._own_stream)
            self._own_stream = None
        self._keepalive = None

    def __del__(self) -> None:
        # cudaFree waits for the device's queued work, the upload from the host copy
        # this array keeps included, before both go.
        try:
            self.free()
        except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone
            pass

    def __enter__(self) -> "FakeDeviceArray":
        return self

    def __exit__(self, *exc) -> None:
        self.free()


def read_cai(obj) -> dict:
    """The (pointer, shape, typestr, stream) of an object's CUDA array interface (or of such
    a dict itself). Only C-contiguous data is supported."""
    cai = obj if isinstance(obj, dict) else obj.__cuda_array_interface__
    shape = tuple(int(d) for d in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None:
        expected = tuple(int(s) for s in np.empty(shape, dtype).strides)
        if tuple(strides) != expected:
            raise ValueError(f"only C-contiguous arrays are supported (strides {strides})")
    stream = cai.get("stream") if int(cai.get("version", 0)) >= 3 else None
    return {"ptr": int(cai["data"][0] or 0), "shape": shape, "typestr": cai["typestr"], "stream": stream}


def cai_to_numpy(obj) -> np.ndarray:
    """Copies an object exposing ``__cuda_array_interface__`` to NumPy, honouring its
    ``stream``: a private stream waits on an event recorded on the producer's stream, copies,
    and is synchronized."""
    info = read_cai(obj)
    out = np.empty(info["shape"], np.dtype(info["typestr"]))
    private = create_stream(non_blocking=True)
    event = None
    try:
        if info["stream"] is not None:
            event = create_event()
            record_event(event, info["stream"])
            stream_wait_event(private, event)
        if out.nbytes:
            memcpy_async(out.ctypes.data, info["ptr"], out.nbytes, cudaMemcpyDeviceToHost, private)
        stream_synchronize(private)
    finally:
        if event is not None:
            destroy_event(event)
        destroy_stream(private)
    return out
