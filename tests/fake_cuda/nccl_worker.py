"""One rank of a multi-process test of the fake NCCL, and ctypes bindings for it.

Run as ``python nccl_worker.py SCENARIO RANK NRANKS OUTDIR`` with the ncclUniqueId as hex
on stdin (one line). Prints ``PASS SCENARIO rank R`` when all checks held; a failed check
raises (non-zero exit with a traceback). test_fake_cuda.py starts the ranks.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `tests.fake_cuda` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fake_cuda import device  # noqa: E402

# ncclResult_t
SUCCESS, UNHANDLED_CUDA, SYSTEM, INTERNAL, INVALID_ARGUMENT, INVALID_USAGE, REMOTE, IN_PROGRESS = range(8)
# ncclDataType_t
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = range(10)
NP_TYPES = {INT8: np.int8, UINT8: np.uint8, INT32: np.int32, UINT32: np.uint32, INT64: np.int64,
            UINT64: np.uint64, FLOAT16: np.float16, FLOAT32: np.float32, FLOAT64: np.float64,
            BFLOAT16: np.uint16}  # bfloat16 travels as its bit pattern
# ncclRedOp_t
SUM, PROD, MAX, MIN, AVG = range(5)
SCALAR_DEVICE, SCALAR_HOST = 0, 1


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class NcclError(RuntimeError):
    def __init__(self, what: str, code: int, text: str) -> None:
        super().__init__(f"{what} returned {code}: {text}")
        self.code = code


class Nccl:
    """ctypes bindings over OUTDIR/libnccl.so (which shares OUTDIR/libcudart.so)."""

    def __init__(self, outdir: str) -> None:
        device.load(outdir)
        self.lib = lib = ctypes.CDLL(os.path.join(outdir, "libnccl.so"))
        P, I, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        sigs = {
            "ncclGetVersion": [ctypes.POINTER(I)],
            "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
            "ncclCommInitRank": [ctypes.POINTER(P), I, UniqueId, I],
            "ncclCommDestroy": [P], "ncclCommAbort": [P],
            "ncclCommGetAsyncError": [P, ctypes.POINTER(I)],
            "ncclCommCount": [P, ctypes.POINTER(I)], "ncclCommUserRank": [P, ctypes.POINTER(I)],
            "ncclCommCuDevice": [P, ctypes.POINTER(I)],
            "ncclAllReduce": [P, P, S, I, I, P, P], "ncclBroadcast": [P, P, S, I, I, P, P],
            "ncclReduceScatter": [P, P, S, I, I, P, P], "ncclAllGather": [P, P, S, I, P, P],
            "ncclSend": [P, S, I, I, P, P], "ncclRecv": [P, S, I, I, P, P],
            "ncclGroupStart": [], "ncclGroupEnd": [],
            "ncclRedOpCreatePreMulSum": [ctypes.POINTER(I), P, I, I, P],
            "ncclRedOpDestroy": [I, P],
        }
        for name, argtypes in sigs.items():
            getattr(lib, name).argtypes = argtypes
            getattr(lib, name).restype = I
        lib.ncclGetErrorString.argtypes = [I]
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetLastError.argtypes = [P]
        lib.ncclGetLastError.restype = ctypes.c_char_p

    def call(self, name: str, *args, comm=None) -> None:
        """Calls `name`; raises NcclError unless it returned ncclSuccess."""
        rc = getattr(self.lib, name)(*args)
        if rc != SUCCESS:
            raise NcclError(name, rc, self.last_error(comm))

    def rc(self, name: str, *args) -> int:
        return getattr(self.lib, name)(*args)

    def last_error(self, comm=None) -> str:
        return self.lib.ncclGetLastError(comm).decode()

    def unique_id(self) -> bytes:
        uid = UniqueId()
        self.call("ncclGetUniqueId", ctypes.byref(uid))
        return ctypes.string_at(ctypes.addressof(uid), 128)

    def init_rank(self, nranks: int, uid: bytes, rank: int) -> int:
        comm = ctypes.c_void_p()
        u = UniqueId()
        ctypes.memmove(ctypes.byref(u), uid, 128)
        self.call("ncclCommInitRank", ctypes.byref(comm), nranks, u, rank)
        return comm.value

    def async_error(self, comm) -> int:
        out = ctypes.c_int(-1)
        self.call("ncclCommGetAsyncError", comm, ctypes.byref(out))
        return out.value

    def premul(self, comm, scalar: np.ndarray, dtype: int, residence: int) -> int:
        op = ctypes.c_int()
        self.call("ncclRedOpCreatePreMulSum", ctypes.byref(op), scalar.ctypes.data, dtype, residence, comm)
        return op.value


def ptr(a: np.ndarray, offset_elems: int = 0) -> int:
    return int(a.ctypes.data + int(offset_elems) * a.itemsize)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# ---- Reference reductions (the fake's documented semantics, in NumPy) -------------------------

def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(v: np.ndarray) -> np.ndarray:
    u = np.asarray(v, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def to_acc(x: np.ndarray, dt: int) -> np.ndarray:
    if dt == FLOAT16:
        return x.astype(np.float32)
    if dt == BFLOAT16:
        return bf16_to_f32(x)
    return x


def from_acc(v: np.ndarray, dt: int) -> np.ndarray:
    if dt == FLOAT16:
        return v.astype(np.float16)
    if dt == BFLOAT16:
        return f32_to_bf16(v)
    return v


def expected_reduction(inputs, dt: int, op: int, scalar=None) -> np.ndarray:
    """Reduce in rank order in the accumulation type; round once at the end."""
    xs = [to_acc(x, dt) for x in inputs]
    with np.errstate(over="ignore", invalid="ignore"):
        if scalar is not None:
            s = to_acc(np.array([scalar], NP_TYPES[dt]), dt)[0]
            acc = xs[0] * s
            for x in xs[1:]:
                acc = acc + x * s
        else:
            acc = xs[0].copy()
            for x in xs[1:]:
                acc = {SUM: np.add, AVG: np.add, PROD: np.multiply, MAX: np.maximum, MIN: np.minimum}[op](acc, x)
            if op == AVG:
                n = len(xs)
                if np.issubdtype(acc.dtype, np.floating):
                    acc = acc / acc.dtype.type(n)
                elif np.issubdtype(acc.dtype, np.signedinteger):
                    wide = acc.astype(np.int64)
                    acc = (np.sign(wide) * (np.abs(wide) // n)).astype(acc.dtype)
                else:
                    acc = acc // acc.dtype.type(n)
    return from_acc(acc, dt)


def make_input(seed: int, dt: int, n: int, op: int = SUM) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dt == BFLOAT16:
        return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    t = NP_TYPES[dt]
    if np.issubdtype(t, np.floating):
        scale = 1.0 if op == PROD else 4.0
        return (rng.standard_normal(n) * scale).astype(t)
    info = np.iinfo(t)
    lo, hi = (0, 12) if info.min == 0 else (-12, 12)
    if op in (MAX, MIN, SUM):  # the full range too, where wrapping/ordering matters
        lo, hi = info.min // 2, info.max // 2
    return rng.integers(lo, hi, n, dtype=t, endpoint=True)


# ---- Scenarios ---------------------------------------------------------------------------------

class Ctx:
    def __init__(self, rank: int, nranks: int, outdir: str, uid: bytes) -> None:
        self.rank, self.nranks = rank, nranks
        self.nccl = Nccl(outdir)
        self.comm = self.nccl.init_rank(nranks, uid, rank)
        self.stream = device.create_stream()
        self.keep = []  # buffers in flight

    def sync(self) -> None:
        device.stream_synchronize(self.stream)

    def destroy(self) -> None:
        self.nccl.call("ncclCommDestroy", self.comm)
        device.destroy_stream(self.stream)


def scenario_collectives(c: Ctx) -> None:
    nccl, comm, s, R, N = c.nccl, c.comm, c.stream, c.rank, c.nranks
    count = 3000
    checks = []  # (description, actual array, expected array)
    case = 0
    for dt in range(10):
        t = NP_TYPES[dt]
        scal = {INT8: 3, UINT8: 3, INT32: -3, UINT32: 3, INT64: -3, UINT64: 3}.get(dt, 1.5)
        scalar_arr = np.array([scal], t) if dt != BFLOAT16 else np.array([0x3FC0], np.uint16)  # 1.5
        scalar_val = scalar_arr[0] if dt != BFLOAT16 else np.uint16(0x3FC0)
        c.keep.append(scalar_arr)  # read when the (ncclScalarDevice) operation runs
        ops = [(SUM, None), (PROD, None), (MAX, None), (MIN, None), (AVG, None)]
        for residence in (SCALAR_HOST, SCALAR_DEVICE):
            ops.append((nccl.premul(comm, scalar_arr, dt, residence), scalar_val))
        for op, scalar in ops:
            case += 1
            base_op = op if op < 5 else SUM
            inputs = [make_input(1000 * case + r, dt, count, base_op) for r in range(N)]
            send = inputs[R].copy()
            in_place = case % 3 == 0
            recv = send if in_place else np.full(count, 7, t)
            nccl.call("ncclAllReduce", ptr(send), ptr(recv), count, dt, op, comm, s)
            exp = expected_reduction(inputs, dt, base_op, scalar)
            checks.append((f"allreduce dtype={dt} op={op} in_place={in_place}", recv, exp))
            c.keep.append(send)
    # A premul op, destroyed after use: queued operations keep their copy.
    op = nccl.premul(comm, np.array([2.0], np.float32), FLOAT32, SCALAR_HOST)
    a = np.arange(10, dtype=np.float32) + R
    b = np.zeros(10, np.float32)
    nccl.call("ncclAllReduce", ptr(a), ptr(b), 10, FLOAT32, op, comm, s)
    nccl.call("ncclRedOpDestroy", op, comm)
    checks.append(("premul after destroy", b, expected_reduction(
        [np.arange(10, dtype=np.float32) + r for r in range(N)], FLOAT32, SUM, np.float32(2.0))))

    for root in range(N):  # broadcast from every root, in place and not
        data = make_input(50 + root, FLOAT32, count)
        src = data.copy() if R == root else np.zeros(count, np.float32)
        dst = np.zeros(count, np.float32)
        nccl.call("ncclBroadcast", ptr(src) if R == root else None, ptr(dst), count, FLOAT32, root, comm, s)
        checks.append((f"broadcast root={root}", dst, data))
        inplace = data.copy() if R == root else np.zeros(count, np.float32)
        nccl.call("ncclBroadcast", ptr(inplace), ptr(inplace), count, FLOAT32, root, comm, s)
        checks.append((f"broadcast in place root={root}", inplace, data))
        c.keep.append(src)

    rc = 1500
    for dt, op in ((FLOAT32, SUM), (FLOAT32, AVG), (INT32, SUM), (FLOAT16, SUM), (BFLOAT16, MAX), (FLOAT64, PROD)):
        inputs = [make_input(70 + r + 10 * dt + 100 * op, dt, rc * N, op) for r in range(N)]
        send = inputs[R].copy()
        recv = np.zeros(rc, NP_TYPES[dt])
        nccl.call("ncclReduceScatter", ptr(send), ptr(recv), rc, dt, op, comm, s)
        full = expected_reduction(inputs, dt, op)
        checks.append((f"reducescatter dtype={dt} op={op}", recv, full[R * rc:(R + 1) * rc]))
        c.keep.append(send)
    # In place: recvbuff = sendbuff + rank * recvcount.
    inputs = [make_input(90 + r, FLOAT64, rc * N) for r in range(N)]
    buf = inputs[R].copy()
    nccl.call("ncclReduceScatter", ptr(buf), ptr(buf, R * rc), rc, FLOAT64, SUM, comm, s)
    checks.append(("reducescatter in place", buf[R * rc:(R + 1) * rc],
                   expected_reduction(inputs, FLOAT64, SUM)[R * rc:(R + 1) * rc]))

    sc = 1234
    for dt in (UINT8, FLOAT64, BFLOAT16):
        parts = [make_input(110 + r + dt, dt, sc) for r in range(N)]
        send = parts[R].copy()
        recv = np.zeros(sc * N, NP_TYPES[dt])
        nccl.call("ncclAllGather", ptr(send), ptr(recv), sc, dt, comm, s)
        checks.append((f"allgather dtype={dt}", recv, np.concatenate(parts)))
        c.keep.append(send)
    parts = [make_input(130 + r, INT64, sc) for r in range(N)]
    buf = np.zeros(sc * N, np.int64)
    buf[R * sc:(R + 1) * sc] = parts[R]
    nccl.call("ncclAllGather", ptr(buf, R * sc), ptr(buf), sc, INT64, comm, s)
    checks.append(("allgather in place", buf, np.concatenate(parts)))

    # Zero counts are fine (and NULL buffers with them).
    nccl.call("ncclAllReduce", None, None, 0, FLOAT32, SUM, comm, s)
    nccl.call("ncclBroadcast", None, None, 0, FLOAT32, 0, comm, s)
    nccl.call("ncclReduceScatter", None, None, 0, FLOAT32, SUM, comm, s)
    nccl.call("ncclAllGather", None, None, 0, FLOAT32, comm, s)

    c.sync()
    assert nccl.async_error(comm) == SUCCESS
    for what, got, exp in checks:
        assert got.dtype == exp.dtype, (what, got.dtype, exp.dtype)
        if not np.array_equal(got.view(np.uint8), exp.view(np.uint8)):
            bad = np.flatnonzero(got != exp)[:5]
            raise AssertionError(f"{what}: differs at {bad}: got {got[bad]} expected {exp[bad]}")
    c.destroy()


def scenario_p2p(c: Ctx) -> None:
    nccl, comm, s, R, N = c.nccl, c.comm, c.stream, c.rank, c.nranks

    def size(src: int, dst: int) -> int:  # uneven, some zero, self included
        return ((src * 7 + dst * 3) % 5) * 700

    def payload(src: int, dst: int, k: int = 0) -> np.ndarray:
        return (np.arange(size(src, dst), dtype=np.float32) + 100000 * src + 1000 * dst + 0.5 * k)

    # An all-to-all-v in one group, sends and receives interleaved, plus a second (smaller)
    # message to every peer that must arrive after the first one.
    sends = {p: payload(R, p) for p in range(N)}
    seconds = {p: np.full(3 + p, R * 10 + p, np.int32) for p in range(N)}
    recvs = {p: np.full(size(p, R), -1, np.float32) for p in range(N)}
    recv2 = {p: np.zeros(3 + R, np.int32) for p in range(N)}
    nccl.call("ncclGroupStart")
    for k in range(N):
        p_to, p_from = (R + k) % N, (R - k) % N
        nccl.call("ncclRecv", ptr(recvs[p_from]), recvs[p_from].size, FLOAT32, p_from, comm, s)
        nccl.call("ncclSend", ptr(sends[p_to]), sends[p_to].size, FLOAT32, p_to, comm, s)
    for p in range(N):
        nccl.call("ncclSend", ptr(seconds[p]), seconds[p].size, INT32, p, comm, s)
        nccl.call("ncclRecv", ptr(recv2[p]), recv2[p].size, INT32, p, comm, s)
    nccl.call("ncclGroupEnd")

    # Messages far larger than a ring, both ways at once (no deadlock), in a nested group.
    big = 60000
    mine = np.arange(big, dtype=np.float64) * (R + 1)
    peer = (R + 1) % N
    src = (R - 1) % N
    got = np.zeros(big, np.float64)
    nccl.call("ncclGroupStart")
    nccl.call("ncclGroupStart")
    nccl.call("ncclSend", ptr(mine), big, FLOAT64, peer, comm, s)
    nccl.call("ncclGroupEnd")
    nccl.call("ncclRecv", ptr(got), big, FLOAT64, src, comm, s)
    nccl.call("ncclGroupEnd")

    # A ragged allgather as grouped broadcasts with different roots (one part empty).
    part_sizes = [0 if r == 1 else 37 * r + 5 for r in range(N)]
    offsets = np.concatenate([[0], np.cumsum(part_sizes)]).astype(int)
    parts = [np.arange(part_sizes[r], dtype=np.int64) * 3 + r for r in range(N)]
    ragged = np.full(offsets[-1], -1, np.int64)
    nccl.call("ncclGroupStart")
    for r in range(N):
        nccl.call("ncclBroadcast", ptr(parts[R]) if r == R else None, ptr(ragged, offsets[r]), part_sizes[r],
                  INT64, r, comm, s)
    nccl.call("ncclGroupEnd")

    # Only ranks 0 and 1 talk (outside a group, larger than the ring); the others idle.
    pair = np.zeros(50000, np.uint8)
    if R == 0:
        pair[:] = np.arange(50000) % 251
        nccl.call("ncclSend", ptr(pair), pair.size, UINT8, 1, comm, s)
    elif R == 1:
        nccl.call("ncclRecv", ptr(pair), pair.size, UINT8, 0, comm, s)
    # ... then everyone meets again.
    one = np.ones(4, np.int32)
    nccl.call("ncclAllReduce", ptr(one), ptr(one), 4, INT32, SUM, comm, s)

    c.sync()
    assert nccl.async_error(comm) == SUCCESS
    for p in range(N):
        np.testing.assert_array_equal(recvs[p], payload(p, R), err_msg=f"from {p}")
        np.testing.assert_array_equal(recv2[p], np.full(3 + R, p * 10 + R, np.int32), err_msg=f"2nd from {p}")
    np.testing.assert_array_equal(got, np.arange(big, dtype=np.float64) * (src + 1))
    np.testing.assert_array_equal(ragged, np.concatenate(parts))
    if R == 1:
        np.testing.assert_array_equal(pair, np.arange(50000) % 251)
    np.testing.assert_array_equal(one, np.full(4, N, np.int32))
    c.destroy()


def scenario_ordering(c: Ctx) -> None:
    """Run with a long stream delay: results reach other streams only through events."""
    nccl, comm, R, N = c.nccl, c.comm, c.rank, c.nranks
    a = device.create_stream()
    b = device.create_stream()
    host = np.arange(1000, dtype=np.float32) * (R + 1)
    x = device.FakeDeviceArray.from_numpy(host, stream=a)  # lands after the delay
    nccl.call("ncclAllReduce", x.ptr, x.ptr, 1000, FLOAT32, SUM, comm, a)
    ev = device.create_event()
    device.record_event(ev, a)
    device.stream_wait_event(b, ev)
    out = np.zeros(1000, np.float32)
    device.memcpy_async(out.ctypes.data, x.ptr, out.nbytes, device.cudaMemcpyDeviceToHost, b)
    device.stream_synchronize(b)
    expected = np.arange(1000, dtype=np.float32) * (N * (N + 1) // 2)
    np.testing.assert_array_equal(out, expected)
    # The interface's stream is a (the allreduce's stream): a reader honouring it agrees.
    np.testing.assert_array_equal(device.cai_to_numpy(x), expected)
    device.destroy_event(ev)
    x.free()
    device.destroy_stream(a)
    device.destroy_stream(b)
    c.destroy()


def scenario_abort(c: Ctx) -> None:
    nccl, comm, s, R = c.nccl, c.comm, c.stream, c.rank
    if R == 0:
        send = np.ones(100, np.float32)
        blocked = np.full(100, -1, np.float32)
        queued = np.full(100, -2, np.float32)
        nccl.call("ncclAllReduce", ptr(send), ptr(blocked), 100, FLOAT32, SUM, comm, s)
        nccl.call("ncclAllReduce", ptr(send), ptr(queued), 100, FLOAT32, SUM, comm, s)
        time.sleep(0.5)
        assert device.lib().cudaStreamQuery(s) == device.cudaErrorNotReady  # rank 1 never joins
        threading.Thread(target=nccl.call, args=("ncclCommAbort", comm)).start()
        t0 = time.monotonic()
        c.sync()
        assert time.monotonic() - t0 < 2.0
        assert (blocked == -1).all() and (queued == -2).all()  # buffers left alone
        assert nccl.async_error(comm) == INVALID_USAGE
        rc = nccl.rc("ncclAllReduce", ptr(send), ptr(send), 100, FLOAT32, SUM, comm, s)
        assert rc == INVALID_USAGE, rc
        assert nccl.rc("ncclCommDestroy", comm) == INVALID_USAGE
    else:
        # The peer's abort shows up without any operation pending here ...
        wait_for(lambda: nccl.async_error(comm) != SUCCESS, 10, "the peer's abort")
        assert nccl.async_error(comm) == REMOTE
        assert "rank 0" in nccl.last_error(comm), nccl.last_error(comm)
        # ... and operations queued now fail without blocking.
        buf = np.full(10, 3, np.float32)
        nccl.call("ncclAllReduce", ptr(buf), ptr(buf), 10, FLOAT32, SUM, comm, s)
        c.sync()
        assert (buf == 3).all()
        nccl.call("ncclCommDestroy", comm)
    device.destroy_stream(s)


def scenario_dead_peer(c: Ctx) -> None:
    """Rank 1 exits right after init; rank 0's allreduce fails (or, with
    HVDLITE_FAKE_NCCL_DEAD_PEER=hang, hangs until aborted)."""
    nccl, comm, s = c.nccl, c.comm, c.stream
    if c.rank == 1:
        os._exit(0)
    hang = os.environ.get("HVDLITE_FAKE_NCCL_DEAD_PEER") == "hang"
    buf = np.ones(10, np.float32)
    t0 = time.monotonic()
    nccl.call("ncclAllReduce", ptr(buf), ptr(buf), 10, FLOAT32, SUM, comm, s)
    if not hang:
        c.sync()
        assert 0.9 < time.monotonic() - t0 < 5, time.monotonic() - t0
        assert nccl.async_error(comm) == REMOTE
        assert "exited" in nccl.last_error(comm), nccl.last_error(comm)
        nccl.call("ncclCommDestroy", comm)
        return
    time.sleep(2.5)
    assert device.lib().cudaStreamQuery(s) == device.cudaErrorNotReady
    assert nccl.async_error(comm) == SUCCESS
    if os.environ.get("EXIT_WITH_BLOCKED_WORK"):
        print(f"PASS dead_peer rank {c.rank}", flush=True)
        sys.exit(0)  # must not hang at exit
    nccl.call("ncclCommAbort", comm)
    c.sync()


def scenario_inject_sync(c: Ctx) -> None:
    """HVDLITE_FAKE_NCCL_FAIL=ncclAllReduce:1:2: rank 1's 2nd allreduce fails at once."""
    nccl, comm, s, R = c.nccl, c.comm, c.stream, c.rank
    bufs = []
    for i in range(3 if R == 0 else 4):
        b = np.ones(8, np.float32)
        rc = nccl.rc("ncclAllReduce", ptr(b), ptr(b), 8, FLOAT32, SUM, comm, s)
        if R == 1 and i == 1:
            assert rc == INTERNAL, rc
            assert nccl.last_error(comm) == "injected failure"
            continue
        assert rc == SUCCESS, rc
        bufs.append(b)
    c.sync()
    for b in bufs:
        np.testing.assert_array_equal(b, np.full(8, 2, np.float32))
    assert nccl.async_error(comm) == SUCCESS
    c.destroy()


def scenario_inject_async(c: Ctx) -> None:
    """HVDLITE_FAKE_NCCL_ASYNC_FAIL=ncclAllReduce:1:1: rank 1's allreduce is queued, then
    fails; rank 0's waits until rank 1 aborts, then fails with ncclRemoteError."""
    nccl, comm, s, R = c.nccl, c.comm, c.stream, c.rank
    b = np.ones(8, np.float32)
    nccl.call("ncclAllReduce", ptr(b), ptr(b), 8, FLOAT32, SUM, comm, s)
    if R == 1:
        c.sync()
        assert nccl.async_error(comm) == INTERNAL
        assert "injected" in nccl.last_error(comm)
        time.sleep(0.5)
        nccl.call("ncclCommAbort", comm)
    else:
        wait_for(lambda: nccl.async_error(comm) != SUCCESS, 10, "the peer's abort")
        c.sync()
        assert nccl.async_error(comm) == REMOTE
        nccl.call("ncclCommDestroy", comm)
    assert (b == 1).all()


def scenario_mismatch(c: Ctx) -> None:
    nccl, comm, s, R = c.nccl, c.comm, c.stream, c.rank
    buf = np.zeros(12, np.float32)
    if R == 0:
        nccl.call("ncclSend", ptr(buf), 10, FLOAT32, 1, comm, s)
    else:
        nccl.call("ncclRecv", ptr(buf), 12, FLOAT32, 0, comm, s)
    c.sync()
    wait_for(lambda: nccl.async_error(comm) != SUCCESS, 10, "the mismatch")
    assert nccl.async_error(comm) == INVALID_USAGE
    c.destroy()


def scenario_init_timeout(rank: int, nranks: int, outdir: str, uid: bytes) -> None:
    """Only this rank joins: ncclCommInitRank gives up after HVDLITE_FAKE_NCCL_INIT_TIMEOUT_S."""
    nccl = Nccl(outdir)
    comm = ctypes.c_void_p()
    u = UniqueId()
    ctypes.memmove(ctypes.byref(u), uid, 128)
    t0 = time.monotonic()
    rc = nccl.rc("ncclCommInitRank", ctypes.byref(comm), nranks, u, rank)
    assert rc == SYSTEM, rc
    assert 0.4 < time.monotonic() - t0 < 5
    assert "timed out" in nccl.last_error(), nccl.last_error()


SCENARIOS = {
    "collectives": scenario_collectives, "p2p": scenario_p2p, "ordering": scenario_ordering,
    "abort": scenario_abort, "dead_peer": scenario_dead_peer, "inject_sync": scenario_inject_sync,
    "inject_async": scenario_inject_async, "mismatch": scenario_mismatch,
}


def main() -> None:
    scenario, rank, nranks, outdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    uid = bytes.fromhex(sys.stdin.readline().strip())
    if scenario == "init_timeout":
        scenario_init_timeout(rank, nranks, outdir, uid)
    else:
        SCENARIOS[scenario](Ctx(rank, nranks, outdir, uid))
    print(f"PASS {scenario} rank {rank}", flush=True)


if __name__ == "__main__":
    main()
