"""Tests of the fake CUDA runtime and fake NCCL themselves (no GPU, no MPI).

The libraries are built once into a temporary directory with build.sh. Multi-rank NCCL
tests start plain Python processes (nccl_worker.py), handing them the ncclUniqueId on a
pipe.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.fake_cuda import device
from tests.fake_cuda import nccl_worker as nw

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build.sh"
WORKER = HERE / "nccl_worker.py"

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                                reason="no C++ compiler (g++) to build the fake CUDA/NCCL libraries")

# Settings for the rank processes: small slots and rings so collectives and messages span
# many chunks, and a short init timeout so a broken test fails instead of hanging.
RANK_ENV = {"HVDLITE_FAKE_NCCL_SLOT_BYTES": "4096", "HVDLITE_FAKE_NCCL_INIT_TIMEOUT_S": "20"}


class Libs:
    def __init__(self, outdir: Path) -> None:
        self.outdir = str(outdir)
        self.cuda = device.load(self.outdir)
        self.nccl = nw.Nccl(self.outdir)


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> Libs:
    outdir = tmp_path_factory.mktemp("fake_cuda_libs")
    proc = subprocess.run(["bash", str(BUILD), str(outdir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return Libs(outdir)


def shm_name(uid: bytes) -> str:
    return uid[8:].split(b"\0")[0].decode()


def run_ranks(libs: Libs, scenario: str, nranks: int, tmp_path: Path, env=None, only_ranks=None,
              timeout: float = 45) -> list:
    """Runs the scenario's ranks; returns [(returncode, output)] and checks /dev/shm is clean."""
    uid = libs.nccl.unique_id()
    full_env = {**os.environ, **RANK_ENV, **(env or {})}
    full_env["PYTHONPATH"] = str(HERE.parents[1]) + os.pathsep + full_env.get("PYTHONPATH", "")
    procs, logs = [], []
    for r in (range(nranks) if only_ranks is None else only_ranks):
        log = open(tmp_path / f"{scenario}.{nranks}.{r}.out", "w+")
        p = subprocess.Popen([sys.executable, str(WORKER), scenario, str(r), str(nranks), libs.outdir],
                             stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, text=True, env=full_env)
        p.stdin.write(uid.hex() + "\n")
        p.stdin.close()
        procs.append(p)
        logs.append(log)
    deadline = time.monotonic() + timeout
    results = []
    for p, log in zip(procs, logs):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            p.wait()
        log.seek(0)
        results.append((p.returncode, log.read()))
        log.close()
    for p in procs:
        p.wait()
    assert not os.path.exists("/dev/shm" + shm_name(uid)), "shared memory segment leaked"
    return results


def assert_passed(results, scenario: str, ranks=None) -> None:
    for r, (rc, out) in enumerate(results):
        if ranks is not None and r not in ranks:
            continue
        assert rc == 0 and f"PASS {scenario} rank {r}" in out, f"rank {r} (rc {rc}):\n{out[-4000:]}"


# Tests that time the stream delay need the default (the libraries read it when loaded).
needs_default_delay = pytest.mark.skipif(os.environ.get("HVDLITE_FAKE_CUDA_DELAY_US", "200") != "200",
                                         reason="HVDLITE_FAKE_CUDA_DELAY_US is set to a non-default value")


def c_int_out():
    return ctypes.c_int(-1)


# ---- Build -------------------------------------------------------------------------------------

def test_build_script(libs: Libs, tmp_path: Path) -> None:
    lib_path = Path(libs.outdir) / "libcudart.so"
    before = lib_path.stat().st_mtime_ns
    # Again, from another directory: nothing to do.
    proc = subprocess.run(["bash", str(BUILD), libs.outdir], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert lib_path.stat().st_mtime_ns == before
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "usage" in proc.stderr
    proc = subprocess.run(["bash", str(BUILD), str(tmp_path / "x")], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, CXX="no-such-compiler"))
    assert proc.returncode != 0 and "not found" in proc.stderr
    # The API is exported under the real names.
    for name in device._SIGNATURES:
        assert hasattr(libs.cuda, name)
    for name in ("ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy", "ncclCommAbort",
                 "ncclCommGetAsyncError", "ncclCommCount", "ncclCommUserRank", "ncclCommCuDevice",
                 "ncclGetErrorString", "ncclGetLastError", "ncclAllReduce", "ncclBroadcast", "ncclReduceScatter",
                 "ncclAllGather", "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd",
                 "ncclRedOpCreatePreMulSum", "ncclRedOpDestroy"):
        assert hasattr(libs.nccl.lib, name)


# ---- CUDA runtime ----------------------------------------------------------------------------

def test_devices_versions_and_errors(libs: Libs) -> None:
    cuda = libs.cuda
    n = c_int_out()
    assert cuda.cudaGetDeviceCount(ctypes.byref(n)) == 0
    assert n.value == int(os.environ.get("HVDLITE_FAKE_CUDA_DEVICES", 8))
    assert cuda.cudaSetDevice(n.value) == 101  # cudaErrorInvalidDevice
    assert cuda.cudaPeekAtLastError() == 101
    assert cuda.cudaGetLastError() == 101
    assert cuda.cudaGetLastError() == 0
    assert cuda.cudaSetDevice(n.value - 1) == 0
    d = c_int_out()
    assert cuda.cudaGetDevice(ctypes.byref(d)) == 0 and d.value == n.value - 1
    assert cuda.cudaSetDevice(0) == 0
    assert cuda.cudaGetDevice(None) == 1
    v = c_int_out()
    assert cuda.cudaRuntimeGetVersion(ctypes.byref(v)) == 0 and v.value == 12080
    assert cuda.cudaDriverGetVersion(ctypes.byref(v)) == 0 and v.value == 12080
    assert cuda.cudaGetErrorString(1) == b"cudaErrorInvalidValue: invalid argument"
    assert cuda.cudaGetErrorName(400) == b"cudaErrorInvalidResourceHandle"
    assert cuda.cudaGetErrorName(600) == b"cudaErrorNotReady"
    cuda.cudaGetLastError()


def test_current_device_is_per_thread(libs: Libs) -> None:
    seen = []

    def other() -> None:
        d = c_int_out()
        libs.cuda.cudaGetDevice(ctypes.byref(d))
        seen.append(d.value)
        libs.cuda.cudaSetDevice(5)

    libs.cuda.cudaSetDevice(3)
    t = threading.Thread(target=other)
    t.start()
    t.join()
    d = c_int_out()
    libs.cuda.cudaGetDevice(ctypes.byref(d))
    assert seen == [0] and d.value == 3
    libs.cuda.cudaSetDevice(0)


class PointerAttributes(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("device", ctypes.c_int), ("devicePointer", ctypes.c_void_p),
                ("hostPointer", ctypes.c_void_p)]


def pointer_attributes(cuda, p: int) -> tuple:
    # A CUDA 13 sized struct (reserved[8] appended): only the first 24 bytes may change.
    raw = (ctypes.c_ubyte * (ctypes.sizeof(PointerAttributes) + 64))(*([0xAB] * (ctypes.sizeof(PointerAttributes) + 64)))
    assert cuda.cudaPointerGetAttributes(ctypes.addressof(raw), p) == 0
    assert bytes(raw)[ctypes.sizeof(PointerAttributes):] == b"\xab" * 64
    a = PointerAttributes.from_buffer(raw)
    assert a.devicePointer == p and a.hostPointer == p
    return a.type, a.device


def test_memory_and_pointer_attributes(libs: Libs) -> None:
    cuda = libs.cuda
    p = ctypes.c_void_p()
    assert cuda.cudaSetDevice(3) == 0
    assert cuda.cudaMalloc(ctypes.byref(p), 1000) == 0 and p.value % 256 == 0
    dev = p.value
    assert cuda.cudaSetDevice(1) == 0
    assert pointer_attributes(cuda, dev + 999) == (2, 3)  # inside the allocation: its device
    h = ctypes.c_void_p()
    assert cuda.cudaMallocHost(ctypes.byref(h), 64) == 0
    assert pointer_attributes(cuda, h.value + 10)[0] == 1  # cudaMemoryTypeHost
    arr = np.zeros(4)
    assert pointer_attributes(cuda, arr.ctypes.data) == (2, 1)  # anything else: current device
    assert cuda.cudaPointerGetAttributes(None, dev) == 1
    assert cuda.cudaFree(dev + 8) == 1 and cuda.cudaFreeHost(dev) == 1
    assert cuda.cudaFree(dev) == 0 and cuda.cudaFree(None) == 0
    assert cuda.cudaFreeHost(h.value) == 0
    assert cuda.cudaMalloc(ctypes.byref(p), 0) == 0 and not p.value
    assert cuda.cudaMalloc(None, 8) == 1
    s = device.create_stream()
    assert cuda.cudaMallocAsync(ctypes.byref(p), 128, s) == 0 and p.value
    assert cuda.cudaMemsetAsync(p.value, 7, 128, s) == 0
    out = np.zeros(128, np.uint8)
    device.memcpy_async(out.ctypes.data, p.value, 128, device.cudaMemcpyDeviceToHost, s)
    assert cuda.cudaFreeAsync(p.value, s) == 0
    device.stream_synchronize(s)
    assert (out == 7).all()
    assert cuda.cudaFreeAsync(p.value, s) == 1  # already freed
    assert cuda.cudaMemcpyAsync(out.ctypes.data, out.ctypes.data, 1, 9, s) == 1  # bad kind
    device.destroy_stream(s)
    cuda.cudaSetDevice(0)
    cuda.cudaGetLastError()


HostFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Gate:
    """A host function that blocks its stream until opened."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.fn = HostFn(lambda _: self.event.wait(30))

    def enqueue(self, cuda, stream: int) -> None:
        assert cuda.cudaLaunchHostFunc(stream, ctypes.cast(self.fn, ctypes.c_void_p), None) == 0

    def open(self) -> None:
        self.event.set()


def test_stream_order_events_and_waits(libs: Libs) -> None:
    cuda = libs.cuda
    a, b, c = device.create_stream(), device.create_stream(), device.create_stream()
    gate = Gate()
    gate.enqueue(cuda, a)
    src = np.arange(64, dtype=np.int64)
    mid = np.zeros(64, np.int64)
    dst = np.zeros(64, np.int64)
    device.memcpy_async(mid.ctypes.data, src.ctypes.data, mid.nbytes, device.cudaMemcpyDeviceToDevice, a)
    ev = device.create_event()
    assert cuda.cudaEventQuery(ev) == 0  # never recorded: complete
    device.record_event(ev, a)
    device.stream_wait_event(b, ev)
    device.record_event(ev, c)  # re-recorded on an idle stream: b still waits for a's position
    device.memcpy_async(dst.ctypes.data, mid.ctypes.data, dst.nbytes, device.cudaMemcpyDeviceToDevice, b)
    assert cuda.cudaEventSynchronize(ev) == 0  # the new position is reached
    time.sleep(0.05)
    assert cuda.cudaStreamQuery(a) == 600 and cuda.cudaStreamQuery(b) == 600
    assert (mid == 0).all() and (dst == 0).all()
    ev2 = device.create_event()
    device.record_event(ev2, a)
    assert cuda.cudaEventQuery(ev2) == 600
    gate.open()
    device.stream_synchronize(b)
    assert cuda.cudaEventQuery(ev2) == 0
    np.testing.assert_array_equal(dst, src)
    assert cuda.cudaStreamQuery(a) == 0
    for e in (ev, ev2):
        device.destroy_event(e)
    assert cuda.cudaEventQuery(ev) == 400 and cuda.cudaEventDestroy(ev) == 400
    for s in (a, b, c):
        device.destroy_stream(s)
    assert cuda.cudaStreamSynchronize(a) == 400 and cuda.cudaStreamDestroy(a) == 400
    assert cuda.cudaStreamSynchronize(0x1234) == 400
    assert cuda.cudaStreamCreate(None) == 1
    cuda.cudaGetLastError()


@needs_default_delay
def test_unsynchronized_reads_see_stale_data(libs: Libs) -> None:
    s = device.create_stream()
    src = np.arange(1, 21, dtype=np.int32)
    dst = np.zeros(20, np.int32)
    for i in range(20):  # each copy waits HVDLITE_FAKE_CUDA_DELAY_US (200 us) first
        device.memcpy_async(dst.ctypes.data + 4 * i, src.ctypes.data + 4 * i, 4, device.cudaMemcpyHostToDevice, s)
    assert dst[-1] == 0
    device.stream_synchronize(s)
    np.testing.assert_array_equal(dst, src)
    device.destroy_stream(s)


@needs_default_delay
def test_event_timing(libs: Libs) -> None:
    cuda = libs.cuda
    s = device.create_stream()
    start, end, untimed = device.create_event(timing=True), device.create_event(timing=True), device.create_event()
    ms = ctypes.c_float()
    assert cuda.cudaEventElapsedTime(ctypes.byref(ms), start, end) == 400  # not recorded
    device.record_event(start, s)
    buf = np.zeros(10, np.uint8)
    for _ in range(10):
        device.memcpy_async(buf.ctypes.data, buf.ctypes.data + 1, 1, device.cudaMemcpyDeviceToDevice, s)
    device.record_event(end, s)
    device.record_event(untimed, s)
    assert cuda.cudaEventSynchronize(end) == 0
    assert cuda.cudaEventElapsedTime(ctypes.byref(ms), start, end) == 0
    assert 1.5 <= ms.value < 1000
    assert cuda.cudaEventElapsedTime(ctypes.byref(ms), start, untimed) == 400
    assert cuda.cudaEventElapsedTime(None, start, end) == 1
    for e in (start, end, untimed):
        device.destroy_event(e)
    device.destroy_stream(s)
    cuda.cudaGetLastError()


def test_synchronous_calls_wait_for_stream_work(libs: Libs) -> None:
    cuda = libs.cuda
    src = np.arange(100, dtype=np.float64)
    for sync in ("memcpy", "device", "destroy"):
        s = device.create_stream()
        mid = np.zeros(100)
        for i in range(10):
            device.memcpy_async(mid.ctypes.data + 80 * i, src.ctypes.data + 80 * i, 80,
                                device.cudaMemcpyHostToDevice, s)
        if sync == "memcpy":
            out = np.zeros(100)
            assert cuda.cudaMemcpy(out.ctypes.data, mid.ctypes.data, 800, device.cudaMemcpyDeviceToHost) == 0
            np.testing.assert_array_equal(out, src)
        elif sync == "device":
            assert cuda.cudaDeviceSynchronize() == 0
            assert cuda.cudaStreamQuery(s) == 0
        device.destroy_stream(s)  # waits for the stream's work too
        np.testing.assert_array_equal(mid, src)


def test_default_stream_handles(libs: Libs) -> None:
    src = np.arange(8, dtype=np.int32)
    for handle in (0, 1, 2):  # legacy default, cudaStreamLegacy, cudaStreamPerThread
        dst = np.zeros(8, np.int32)
        device.memcpy_async(dst.ctypes.data, src.ctypes.data, 32, device.cudaMemcpyHostToDevice, handle)
        device.stream_synchronize(handle)
        np.testing.assert_array_equal(dst, src)


def test_sync_log(libs: Libs, tmp_path: Path) -> None:
    log = tmp_path / "cuda.log"
    script = (
        "import ctypes, sys, numpy as np\n"
        "from tests.fake_cuda import device as d\n"
        "cuda = d.load(sys.argv[1])\n"
        "s = d.create_stream(); e = d.create_event(); a = np.zeros(4)\n"
        "d.memcpy_async(a.ctypes.data, a.ctypes.data, 8, 3, s)\n"  # not a sync: not logged
        "d.record_event(e, s); cuda.cudaEventSynchronize(e); cuda.cudaStreamSynchronize(s)\n"
        "cuda.cudaDeviceSynchronize(); cuda.cudaMemcpy(a.ctypes.data, a.ctypes.data, 8, 3)\n"
    )
    env = dict(os.environ, HVDLITE_FAKE_CUDA_LOG=str(log), PYTHONPATH=str(HERE.parents[1]))
    procs = [subprocess.Popen([sys.executable, "-c", script, libs.outdir], env=env) for _ in range(2)]
    assert [p.wait(timeout=30) for p in procs] == [0, 0]
    lines = log.read_text().splitlines()
    pids = {p.pid for p in procs}
    assert len(lines) == 8
    names = sorted(line.split()[0] for line in lines)
    assert names == sorted(["cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                            "cudaMemcpy"] * 2)
    assert {int(line.split("pid=")[1]) for line in lines} == pids


def test_device_array_helpers(libs: Libs) -> None:
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = device.FakeDeviceArray.from_numpy(host)
    cai = x.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (3, 4) and cai["typestr"] == "<f4"
    assert cai["data"] == (x.ptr, False) and cai["strides"] is None and isinstance(cai["stream"], int)
    np.testing.assert_array_equal(device.cai_to_numpy(x), host)
    np.testing.assert_array_equal(x.to_numpy(), host)
    x.free()
    y = device.FakeDeviceArray.from_numpy(host, delay_write=False)
    assert y.__cuda_array_interface__["stream"] is None
    np.testing.assert_array_equal(device.cai_to_numpy(y.__cuda_array_interface__), host)
    y.free()

    # A producer stream held back: a reader that honours the interface's stream waits for
    # it; one that ignores it reads what was there before.
    cuda = libs.cuda
    producer = device.create_stream()
    z = device.FakeDeviceArray(host.shape, host.dtype)
    zeros = np.zeros_like(host)
    assert cuda.cudaMemcpy(z.ptr, zeros.ctypes.data, z.nbytes, device.cudaMemcpyHostToDevice) == 0
    gate = Gate()
    gate.enqueue(cuda, producer)
    device.memcpy_async(z.ptr, host.ctypes.data, z.nbytes, device.cudaMemcpyHostToDevice, producer)
    z.stream = producer
    naive = device.cai_to_numpy(dict(z.__cuda_array_interface__, stream=None))
    np.testing.assert_array_equal(naive, zeros)
    threading.Timer(0.1, gate.open).start()
    np.testing.assert_array_equal(device.cai_to_numpy(z), host)
    z.free()
    device.destroy_stream(producer)


# ---- NCCL in this process --------------------------------------------------------------------

def test_nccl_single_process_api(libs: Libs) -> None:
    nccl = libs.nccl
    v = c_int_out()
    nccl.call("ncclGetVersion", ctypes.byref(v))
    assert v.value == 22303
    assert nccl.lib.ncclGetErrorString(6) == b"remote process exited or there was a network error"
    uid = nccl.unique_id()
    assert len(uid) == 128 and shm_name(uid).startswith("/")
    with pytest.raises(nw.NcclError) as err:
        nccl.init_rank(1, b"\0" * 128, 0)
    assert err.value.code == nw.INVALID_ARGUMENT
    with pytest.raises(nw.NcclError) as err:
        nccl.init_rank(2, uid, 2)
    assert err.value.code == nw.INVALID_ARGUMENT

    libs.cuda.cudaSetDevice(2)
    comm = nccl.init_rank(1, uid, 0)
    libs.cuda.cudaSetDevice(0)
    assert not os.path.exists("/dev/shm" + shm_name(uid))  # unlinked once all ranks joined
    out = c_int_out()
    nccl.call("ncclCommCount", comm, ctypes.byref(out))
    assert out.value == 1
    nccl.call("ncclCommUserRank", comm, ctypes.byref(out))
    assert out.value == 0
    nccl.call("ncclCommCuDevice", comm, ctypes.byref(out))
    assert out.value == 2
    s, s2 = device.create_stream(), device.create_stream()
    a = np.arange(10, dtype=np.float32)
    b = np.zeros(10, np.float32)
    nccl.call("ncclAllReduce", nw.ptr(a), nw.ptr(b), 10, nw.FLOAT32, nw.AVG, comm, s)

    def rc_and_text(name, *args):
        return nccl.rc(name, *args), nccl.last_error()

    assert rc_and_text("ncclAllReduce", nw.ptr(a), nw.ptr(b), 10, nw.FLOAT32, nw.SUM, None, s) == \
        (nw.INVALID_ARGUMENT, "comm is NULL")
    assert nccl.rc("ncclAllReduce", nw.ptr(a), nw.ptr(b), 10, 10, nw.SUM, comm, s) == nw.INVALID_ARGUMENT
    assert "data type" in nccl.last_error()
    assert nccl.rc("ncclAllReduce", nw.ptr(a), nw.ptr(b), 10, nw.FLOAT32, 99, comm, s) == nw.INVALID_ARGUMENT
    assert nccl.rc("ncclBroadcast", nw.ptr(a), nw.ptr(b), 10, nw.FLOAT32, 1, comm, s) == nw.INVALID_ARGUMENT
    assert nccl.rc("ncclSend", nw.ptr(a), 10, nw.FLOAT32, -1, comm, s) == nw.INVALID_ARGUMENT
    op = nccl.premul(comm, np.array([2.0]), nw.FLOAT64, nw.SCALAR_HOST)
    assert op >= 5
    assert nccl.rc("ncclAllReduce", nw.ptr(a), nw.ptr(b), 10, nw.FLOAT32, op, comm, s) == nw.INVALID_ARGUMENT
    nccl.call("ncclRedOpDestroy", op, comm)
    assert nccl.rc("ncclRedOpDestroy", op, comm) == nw.INVALID_ARGUMENT
    assert nccl.rc("ncclGroupEnd") == nw.INVALID_USAGE
    # A group on two streams is refused (the fake's restriction).
    nccl.call("ncclGroupStart")
    nccl.call("ncclAllReduce", nw.ptr(a), nw.ptr(a), 10, nw.FLOAT32, nw.SUM, comm, s)
    nccl.call("ncclAllReduce", nw.ptr(a), nw.ptr(a), 10, nw.FLOAT32, nw.SUM, comm, s2)
    assert nccl.rc("ncclGroupEnd") == nw.INVALID_USAGE
    # Self send/receive.
    c = np.zeros(10, np.float32)
    nccl.call("ncclGroupStart")
    nccl.call("ncclSend", nw.ptr(a), 10, nw.FLOAT32, 0, comm, s)
    nccl.call("ncclRecv", nw.ptr(c), 10, nw.FLOAT32, 0, comm, s)
    nccl.call("ncclGroupEnd")
    device.stream_synchronize(s)
    np.testing.assert_array_equal(b, a)
    np.testing.assert_array_equal(c, a)
    assert nccl.async_error(comm) == nw.SUCCESS
    nccl.call("ncclCommDestroy", comm)
    assert nccl.rc("ncclAllReduce", nw.ptr(a), nw.ptr(b), 10, nw.FLOAT32, nw.SUM, comm, s) == nw.INVALID_USAGE
    device.destroy_stream(s)
    device.destroy_stream(s2)


def test_nccl_ranks_as_threads(libs: Libs) -> None:
    """Two ranks of one communicator in one process, each on its own thread and stream."""
    nccl = libs.nccl
    uid = nccl.unique_id()
    results, errors = {}, []

    def rank_main(r: int) -> None:
        try:
            comm = nccl.init_rank(2, uid, r)
            s = device.create_stream()
            a = np.full(5000, r + 1, np.int64)
            got = np.zeros(2, np.int64)
            nccl.call("ncclAllReduce", nw.ptr(a), nw.ptr(a), 5000, nw.INT64, nw.SUM, comm, s)
            nccl.call("ncclGroupStart")
            mine = np.full(2, 10 * r, np.int64)
            nccl.call("ncclSend", nw.ptr(mine), 2, nw.INT64, 1 - r, comm, s)
            nccl.call("ncclRecv", nw.ptr(got), 2, nw.INT64, 1 - r, comm, s)
            nccl.call("ncclGroupEnd")
            device.stream_synchronize(s)
            results[r] = (a.copy(), got.copy())
            nccl.call("ncclCommDestroy", comm)
            device.destroy_stream(s)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for r in range(2):
        assert (results[r][0] == 3).all() and (results[r][1] == 10 * (1 - r)).all()


# ---- NCCL across processes -------------------------------------------------------------------

@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_nccl_collectives(libs: Libs, tmp_path: Path, nranks: int) -> None:
    """Every op (incl. Avg and PreMulSum) and dtype (incl. float16/bfloat16), broadcast,
    reducescatter, allgather, in place and not, zero counts, bitwise against NumPy."""
    assert_passed(run_ranks(libs, "collectives", nranks, tmp_path), "collectives")


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_nccl_point_to_point_and_grouped_broadcasts(libs: Libs, tmp_path: Path, nranks: int) -> None:
    assert_passed(run_ranks(libs, "p2p", nranks, tmp_path), "p2p")


def test_nccl_stream_ordering_and_logs(libs: Libs, tmp_path: Path) -> None:
    nccl_log, cuda_log = tmp_path / "nccl.log", tmp_path / "cuda.log"
    env = {"HVDLITE_FAKE_CUDA_DELAY_US": "20000", "HVDLITE_FAKE_NCCL_LOG": str(nccl_log),
           "HVDLITE_FAKE_CUDA_LOG": str(cuda_log)}
    assert_passed(run_ranks(libs, "ordering", 2, tmp_path, env), "ordering")
    lines = nccl_log.read_text().splitlines()
    assert [ln for ln in lines if ln.startswith("ncclCommInitRank rank=0 ")][0].endswith(" nranks=2")
    allreduces = [ln for ln in lines if ln.split()[0] == "ncclAllReduce"]
    assert len(allreduces) == 2
    for ln in allreduces:
        fields = dict(f.split("=") for f in ln.split()[1:])
        assert fields["count"] == "1000" and fields["dtype"] == "7" and fields["op"] == "0"
    assert sorted(dict(f.split("=") for f in ln.split()[1:])["rank"] for ln in allreduces) == ["0", "1"]
    assert sum(ln.startswith("ncclCommDestroy ") for ln in lines) == 2
    syncs = cuda_log.read_text().splitlines()
    assert len({ln.split("pid=")[1] for ln in syncs if ln.startswith("cudaStreamSynchronize ")}) == 2


def test_nccl_abort(libs: Libs, tmp_path: Path) -> None:
    assert_passed(run_ranks(libs, "abort", 2, tmp_path), "abort")


def test_nccl_dead_peer_fails_the_operation(libs: Libs, tmp_path: Path) -> None:
    assert_passed(run_ranks(libs, "dead_peer", 2, tmp_path), "dead_peer", ranks=[0])


def test_nccl_dead_peer_hang_mode_and_exit_with_blocked_work(libs: Libs, tmp_path: Path) -> None:
    env = {"HVDLITE_FAKE_NCCL_DEAD_PEER": "hang"}
    assert_passed(run_ranks(libs, "dead_peer", 2, tmp_path, env), "dead_peer", ranks=[0])
    # Exiting while an operation is blocked on the dead peer must not hang the process.
    t0 = time.monotonic()
    results = run_ranks(libs, "dead_peer", 2, tmp_path, dict(env, EXIT_WITH_BLOCKED_WORK="1"))
    assert_passed(results, "dead_peer", ranks=[0])
    assert time.monotonic() - t0 < 15


def test_nccl_injected_failures(libs: Libs, tmp_path: Path) -> None:
    assert_passed(run_ranks(libs, "inject_sync", 2, tmp_path, {"HVDLITE_FAKE_NCCL_FAIL": "ncclAllReduce:1:2"}),
                  "inject_sync")
    assert_passed(run_ranks(libs, "inject_async", 2, tmp_path,
                            {"HVDLITE_FAKE_NCCL_ASYNC_FAIL": "ncclAllReduce:1:1"}), "inject_async")


def test_nccl_send_recv_size_mismatch(libs: Libs, tmp_path: Path) -> None:
    assert_passed(run_ranks(libs, "mismatch", 2, tmp_path), "mismatch")


def test_nccl_init_timeout_leaves_no_segment(libs: Libs, tmp_path: Path) -> None:
    results = run_ranks(libs, "init_timeout", 2, tmp_path, {"HVDLITE_FAKE_NCCL_INIT_TIMEOUT_S": "0.5"},
                        only_ranks=[0])
    assert_passed(results, "init_timeout")
