"""Every collective of hvdlite.torch against a NumPy reference, on any number of ranks.

Every rank builds every rank's input from a seeded generator, so it can compute the
expected result with NumPy alone and compare it with what hvdlite returned.
"""
from __future__ import annotations

import time

import numpy as np
import torch

import hvdlite.torch as hvd
from _wcommon import all_ranks, case, check_close, rank_data, run_cases

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]


def t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True)).to(dtype)  # never aliases the reference


@case
def allreduce_float_ops() -> None:
    r, n = hvd.rank(), hvd.size()
    for dtype in FLOATS:
        xs = all_ranks((3, 5), seed=1)
        x = t(xs[r], dtype)
        before = x.clone()
        for op, ref in [(hvd.Sum, np.sum(xs, 0)), (hvd.Average, np.mean(xs, 0)),
                        (hvd.Min, np.min(xs, 0)), (hvd.Max, np.max(xs, 0))]:
            out = hvd.allreduce(x, op=op, name=f"ar.{dtype}.{op}")
            assert out.dtype == dtype and out.shape == x.shape
            tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) and op == hvd.Average else 1e-6
            check_close(out, ref, f"allreduce {dtype} op={op}", rtol=tol, atol=tol)
        assert torch.equal(x, before), "allreduce modified its input"
        # Product on small values.
        ps = [np.where(a > 0, 1.0, -1.0) * (1 + (np.abs(4 * a) % 3)) for a in xs]  # +-1, 2, 3
        out = hvd.allreduce(t(ps[r], dtype), op=hvd.Product, name=f"prod.{dtype}")
        check_close(out, np.prod(ps, 0), f"allreduce Product {dtype}")


@case
def allreduce_with_compression() -> None:
    r = hvd.rank()
    xs = all_ranks((64,), seed=6)
    for comp, wire in [(hvd.Compression.fp16, torch.float16), (hvd.Compression.bf16, torch.bfloat16),
                       (hvd.Compression.none, torch.float32)]:
        x = t(xs[r] * 1.001, torch.float32)
        sent, ctx = comp.compress(x)
        assert sent.dtype == wire
        out = hvd.allreduce(x, op=hvd.Average, compression=comp, name=f"comp.{wire}")
        assert out.dtype == torch.float32, f"{comp.__name__} must restore float32"
        tol = 1e-2 if wire != torch.float32 else 1e-6
        check_close(out, np.mean([a * 1.001 for a in xs], 0), f"allreduce {comp.__name__}",
                    rtol=tol, atol=tol)
    # Integers are not compressed.
    i = torch.arange(5, dtype=torch.int64) + r
    out = hvd.allreduce(i, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert out.dtype == torch.int64
    check_close(out, np.sum([np.arange(5) + k for k in range(hvd.size())], 0), "int with fp16")


@case
def allreduce_int_ops() -> None:
    r = hvd.rank()
    for dtype in INTS:
        low, high = (0, 30) if dtype == torch.uint8 else (-30, 30)
        xs = [np.floor(a) for a in all_ranks((4, 3), seed=2, low=low // 4, high=high // 4)]
        xs = [np.clip(a * 1, low, high) for a in xs]
        x = t(xs[r], dtype)
        for op, ref in [(hvd.Sum, np.sum(xs, 0)), (hvd.Min, np.min(xs, 0)),
                        (hvd.Max, np.max(xs, 0))]:
            out = hvd.allreduce(x, op=op)
            assert out.dtype == dtype
            check_close(out, ref, f"allreduce {dtype} op={op}", atol=0)


@case
def allreduce_scaling_and_deprecated_average() -> None:
    r = hvd.rank()
    xs = all_ranks((6,), seed=3)
    x = t(xs[r], torch.float64)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    check_close(out, 1.5 * np.sum(xs, 0), "allreduce pre/postscale")
    out = hvd.allreduce(x)  # default op is Average
    check_close(out, np.mean(xs, 0), "allreduce default op")
    out = hvd.allreduce(x, average=False)
    check_close(out, np.sum(xs, 0), "allreduce average=False")
    try:
        hvd.allreduce(x, average=True, op=hvd.Sum)
    except ValueError:
        pass
    else:
        raise AssertionError("average= together with op= must raise ValueError")


@case
def allreduce_inplace_async_and_noncontiguous() -> None:
    r = hvd.rank()
    xs = all_ranks((4, 6), seed=4)
    x = t(xs[r], torch.float32)
    ptr = x.data_ptr()
    h = hvd.allreduce_async_(x, op=hvd.Sum, name="inplace")
    res = hvd.synchronize(h)
    assert res is x and x.data_ptr() == ptr
    check_close(x, np.sum(xs, 0), "allreduce_ in place")
    assert hvd.poll(h)

    # Non-contiguous input: a transposed view.
    base = t(xs[r], torch.float32)
    view = base.t()
    assert not view.is_contiguous()
    out = hvd.allreduce(view, op=hvd.Sum)
    check_close(out, np.sum(xs, 0).T, "allreduce of a transposed view")
    # In place on a non-contiguous view writes through to the base tensor.
    hvd.allreduce_(view, op=hvd.Max)
    check_close(base, np.max(xs, 0), "allreduce_ through a transposed view")
    # Strided slice.
    base2 = t(xs[r], torch.float64)
    sl = base2[:, ::2]
    hvd.allreduce_(sl, op=hvd.Sum)
    want = np.array(xs[r], copy=True)
    want[:, ::2] = np.sum(xs, 0)[:, ::2]
    check_close(base2, want, "allreduce_ on a strided slice leaves other columns alone")

    # Async out-of-place with poll loop.
    h = hvd.allreduce_async(t(xs[r], torch.float32), op=hvd.Min)
    while not hvd.poll(h):
        time.sleep(0.001)
    check_close(hvd.synchronize(h), np.min(xs, 0), "allreduce_async")
    check_close(hvd.synchronize(h), np.min(xs, 0), "synchronize twice returns the result again")


@case
def allreduce_other_dtypes() -> None:
    r = hvd.rank()
    xs = all_ranks((5,), seed=5)
    # int16 (computed in int32).
    x16 = t(np.round(xs[r] * 4), torch.int16)
    out = hvd.allreduce(x16, op=hvd.Sum)
    assert out.dtype == torch.int16
    check_close(out, np.sum([np.round(a * 4) for a in xs], 0), "allreduce int16")
    # bool: Max = any, Min = all.
    bs = [a > 0 for a in xs]
    b = torch.from_numpy(bs[r].copy())
    assert torch.equal(hvd.allreduce(b, op=hvd.Max), torch.from_numpy(np.any(bs, 0)))
    assert torch.equal(hvd.allreduce(b, op=hvd.Min), torch.from_numpy(np.all(bs, 0)))
    try:
        hvd.allreduce(b, op=hvd.Sum)
    except TypeError as e:
        assert "bool" in str(e)
    else:
        raise AssertionError("bool Sum must raise TypeError")
    # complex Sum.
    cs = [a + 1j * a[::-1] for a in xs]
    out = hvd.allreduce(torch.from_numpy(cs[r].astype(np.complex64)), op=hvd.Sum)
    assert out.dtype == torch.complex64
    assert np.allclose(out.numpy(), np.sum(cs, 0))


@case
def grouped_allreduce_ops() -> None:
    r = hvd.rank()
    shapes = [(3,), (2, 4), (5, 1, 2)]
    xs = [all_ranks(s, seed=10 + i) for i, s in enumerate(shapes)]
    mine = [t(x[r], torch.float32) for x in xs]
    outs = hvd.grouped_allreduce(mine, op=hvd.Sum)
    for i, o in enumerate(outs):
        check_close(o, np.sum(xs[i], 0), f"grouped_allreduce member {i}")
    outs = hvd.grouped_allreduce(mine, op=hvd.Average, name="named_group")
    for i, o in enumerate(outs):
        check_close(o, np.mean(xs[i], 0), f"grouped_allreduce average member {i}")
    mine64 = [t(x[r], torch.float64) for x in xs]
    res = hvd.grouped_allreduce_(mine64, op=hvd.Max)
    for i, o in enumerate(res):
        assert o is mine64[i]
        check_close(o, np.max(xs[i], 0), f"grouped_allreduce_ member {i}")
    h = hvd.grouped_allreduce_async([t(x[r], torch.float32) for x in xs], op=hvd.Min)
    for i, o in enumerate(hvd.synchronize(h)):
        check_close(o, np.min(xs[i], 0), f"grouped_allreduce_async member {i}")


@case
def allgather_ops() -> None:
    r, n = hvd.rank(), hvd.size()
    for dtype in FLOATS + INTS:
        rows = [k + 1 for k in range(n)]
        xs = [4 * np.abs(rank_data(k, (rows[k], 3), seed=20)) for k in range(n)]  # integers
        out = hvd.allgather(t(xs[r], dtype))
        assert out.dtype == dtype
        check_close(out, np.concatenate(xs, 0), f"allgather {dtype}")
    # Ranks with zero rows, 1-d, bool, complex, 0-d.
    ones = [np.arange(k, dtype=np.float32) for k in range(n)]
    check_close(hvd.allgather(torch.from_numpy(ones[r])), np.concatenate(ones), "allgather 1-d")
    bs = [np.arange(k + 2) % 2 == 0 for k in range(n)]
    out = hvd.allgather(torch.from_numpy(bs[r]))
    assert out.dtype == torch.bool and np.array_equal(out.numpy(), np.concatenate(bs))
    cs = [(np.arange(2 * (k + 1)) + 1j * k).astype(np.complex128).reshape(k + 1, 2) for k in range(n)]
    out = hvd.allgather(torch.from_numpy(cs[r]))
    assert out.dtype == torch.complex128 and np.array_equal(out.numpy(), np.concatenate(cs))
    out = hvd.allgather(torch.tensor(float(r)))
    check_close(out, np.arange(n, dtype=np.float64), "allgather of 0-d tensors")
    # Non-contiguous input.
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * r
    out = hvd.allgather(m.t())
    check_close(out, np.concatenate([(np.arange(12).reshape(3, 4) + 100 * k).T for k in range(n)]),
                "allgather of a transposed view")
    h = hvd.allgather_async(torch.full((2,), r, dtype=torch.int64))
    check_close(hvd.synchronize(h), np.repeat(np.arange(n), 2), "allgather_async")
    outs = hvd.grouped_allgather([torch.full((1,), r), torch.full((2, 2), 2 * r)])
    check_close(outs[0], np.arange(n), "grouped_allgather 0")
    check_close(outs[1], np.repeat(2 * np.arange(n), 2)[:, None].repeat(2, 1), "grouped_allgather 1")


@case
def broadcast_ops() -> None:
    r, n = hvd.rank(), hvd.size()
    for root in range(n):
        for dtype in FLOATS + INTS + [torch.bool, torch.int16, torch.complex64]:
            xs = all_ranks((3, 2), seed=30 + root)
            if dtype == torch.bool:
                x = torch.from_numpy(xs[r] > 0)
                want = xs[root] > 0
            elif dtype.is_complex:
                x = torch.from_numpy((xs[r] + 1j).astype(np.complex64))
                want = xs[root] + 1j
            else:
                x = t(4 * np.abs(xs[r]), dtype)
                want = 4 * np.abs(xs[root])
            before = x.clone()
            out = hvd.broadcast(x, root)
            assert out.dtype == dtype
            assert np.allclose(out.numpy().astype(np.complex128 if dtype.is_complex else np.float64)
                               if dtype not in (torch.bfloat16, torch.float16)
                               else out.double().numpy(), want), f"broadcast {dtype} root {root}"
            assert torch.equal(x, before), "broadcast modified its input"
            res = hvd.broadcast_(x, root)
            assert res is x
            assert torch.equal(x, out), f"broadcast_ {dtype} root {root}"
    # In place through a non-contiguous view, and a 0-d tensor.
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * r
    hvd.broadcast_(base[:, 1], root_rank=n - 1)
    want = np.arange(12, dtype=np.float32).reshape(3, 4) + 100 * r
    want[:, 1] = (np.arange(12).reshape(3, 4) + 100 * (n - 1))[:, 1]
    check_close(base, want, "broadcast_ through a column view")
    s = torch.tensor(float(r))
    hvd.broadcast_(s, 0)
    assert s.item() == 0.0 and s.dim() == 0
    h = hvd.broadcast_async(torch.tensor([r, r]), root_rank=n - 1)
    check_close(hvd.synchronize(h), np.array([n - 1, n - 1]), "broadcast_async")


@case
def alltoall_ops() -> None:
    r, n = hvd.rank(), hvd.size()
    # Even split: rank k sends rows [2j, 2j+2) to rank j.
    xs = [rank_data(k, (2 * n, 3), seed=40) for k in range(n)]
    out = hvd.alltoall(t(xs[r], torch.float32))
    want = np.concatenate([xs[k][2 * r:2 * r + 2] for k in range(n)])
    check_close(out, want, "alltoall even")
    # Uneven splits: rank k sends (k + j) % 3 rows to rank j.
    splits = [[(k + j) % 3 for j in range(n)] for k in range(n)]
    data = [4 * rank_data(k, (sum(splits[k]), 2), seed=41) for k in range(n)]  # integers
    out, received = hvd.alltoall(t(data[r], torch.float64), splits=splits[r])
    pieces, recv = [], []
    for k in range(n):
        off = sum(splits[k][:r])
        pieces.append(data[k][off:off + splits[k][r]])
        recv.append(splits[k][r])
    check_close(out, np.concatenate(pieces), "alltoall with splits")
    assert received.tolist() == recv, f"received splits {received.tolist()} != {recv}"
    # Splits given as a tensor, int dtype, async.
    h = hvd.alltoall_async(t(data[r], torch.int64), splits=torch.tensor(splits[r], dtype=torch.int32))
    o, rec = hvd.synchronize(h)
    check_close(o, np.concatenate(pieces), "alltoall_async")
    assert rec.tolist() == recv


@case
def alltoall_non_native_1d() -> None:
    # int16 and complex64 are moved as bytes; rows (not bytes) must still be what splits
    # and received splits count, for 1-D tensors too.
    r, n = hvd.rank(), hvd.size()
    for dtype in (torch.int16, torch.complex64):
        def vals(k: int, m: int) -> np.ndarray:
            return 100 * k + np.arange(m)

        def tens(a: np.ndarray) -> torch.Tensor:
            if dtype.is_complex:
                return torch.from_numpy((a + 0.5j * a).astype(np.complex64))
            return torch.from_numpy(a.astype(np.int16))

        xs = [vals(k, 2 * n) for k in range(n)]
        out = hvd.alltoall(tens(xs[r]))
        want = np.concatenate([xs[k][2 * r:2 * r + 2] for k in range(n)])
        assert out.dtype == dtype and out.shape == (2 * n,), (dtype, out.shape)
        assert torch.equal(out, tens(want)), f"alltoall even 1-D {dtype}"
        h = hvd.alltoall_async(tens(xs[r]), splits=[2] * n)
        out, received = hvd.synchronize(h)
        assert torch.equal(out, tens(want)) and received.tolist() == [2] * n, \
            f"alltoall_async 1-D {dtype}: received splits {received.tolist()}"
        splits = [[(k + j) % 3 for j in range(n)] for k in range(n)]
        data = [vals(k, sum(splits[k])) for k in range(n)]
        out, received = hvd.alltoall(tens(data[r]), splits=splits[r])
        pieces = [data[k][sum(splits[k][:r]):sum(splits[k][:r + 1])] for k in range(n)]
        assert out.dtype == dtype and torch.equal(out, tens(np.concatenate(pieces))), \
            f"alltoall 1-D {dtype} with splits"
        assert received.tolist() == [splits[k][r] for k in range(n)], \
            f"received splits {received.tolist()} for 1-D {dtype}"
    # allgather of 1-D int16 still concatenates rows.
    out = hvd.allgather(torch.full((r + 1,), r, dtype=torch.int16))
    assert out.dtype == torch.int16 and out.tolist() == [k for k in range(n) for _ in range(k + 1)]


@case
def inplace_ops_bump_autograd_version() -> None:
    # A backward pass that saved a tensor must notice that an in-place collective
    # overwrote it (as for any in-place torch op) instead of using the new values.
    r, n = hvd.rank(), hvd.size()
    ops = {
        "allreduce_": lambda b: hvd.allreduce_(b, op=hvd.Sum),
        "allreduce_async_": lambda b: hvd.synchronize(hvd.allreduce_async_(b, op=hvd.Sum)),
        "grouped_allreduce_": lambda b: hvd.grouped_allreduce_([b], op=hvd.Sum),
        "broadcast_": lambda b: hvd.broadcast_(b, root_rank=n - 1),
        "broadcast_async_": lambda b: hvd.synchronize(hvd.broadcast_async_(b, root_rank=n - 1)),
    }
    for what, op in ops.items():
        for dtype in (torch.float32, torch.float64):
            x = torch.ones(3, dtype=dtype, requires_grad=True)
            buf = torch.full((3,), float(r + 1), dtype=dtype)
            assert buf.is_contiguous()
            y = (x * buf).sum()  # saves buf for the backward pass
            version = buf._version
            op(buf)
            assert buf._version > version, f"{what} did not bump the version counter"
            try:
                y.backward()
            except RuntimeError as e:
                assert "inplace" in str(e) or "in-place" in str(e), str(e)
            else:
                raise AssertionError(f"backward after {what} on a saved tensor must raise")


@case
def reducescatter_ops() -> None:
    r, n = hvd.rank(), hvd.size()
    for rows in (2 * n, 2 * n + 1, 7):
        xs = all_ranks((rows, 3), seed=50 + rows)
        counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
        start = sum(counts[:r])
        for op, ref in [(hvd.Sum, np.sum(xs, 0)), (hvd.Average, np.mean(xs, 0))]:
            out = hvd.reducescatter(t(xs[r], torch.float32), op=op)
            check_close(out, ref[start:start + counts[r]], f"reducescatter rows={rows} op={op}")
    xs = all_ranks((n, 2), seed=59)
    # Horovod's positional order: (tensor, name, op, ...), no compression argument.
    h = hvd.reducescatter_async(t(xs[r], torch.float64), "rs.async", hvd.Sum)
    check_close(hvd.synchronize(h), np.sum(xs, 0)[r:r + 1], "reducescatter_async")
    # Grouped, with Horovod's positional order (tensors, name, compression, op, process_set,
    # prescale_factor, postscale_factor); fp16 on the wire; uneven row counts.
    a, b = all_ranks((2 * n + 1, 3), seed=60), all_ranks((n, 2), seed=61)
    counts = [(2 * n + 1) // n + (1 if k < (2 * n + 1) % n else 0) for k in range(n)]
    start = sum(counts[:r])
    for comp, tol in ((hvd.Compression.none, None), (hvd.Compression.fp16, 2e-2)):
        outs = hvd.grouped_reducescatter([t(a[r], torch.float32), t(b[r], torch.float32)],
                                         None, comp, hvd.Sum, None, 0.5, 3.0)
        kw = {} if tol is None else {"rtol": tol, "atol": tol}
        check_close(outs[0], 1.5 * np.sum(a, 0)[start:start + counts[r]],
                    f"grouped_reducescatter[0] {comp.__name__}", **kw)
        check_close(outs[1], 1.5 * np.sum(b, 0)[r:r + 1], f"grouped_reducescatter[1] {comp.__name__}",
                    **kw)
        assert outs[0].dtype == torch.float32, outs[0].dtype
    outs = hvd.synchronize(hvd.grouped_reducescatter_async([t(a[r], torch.float64)], "grs", hvd.Average))
    check_close(outs[0], np.mean(a, 0)[start:start + counts[r]], "grouped_reducescatter_async")
    assert hvd.grouped_reducescatter([]) == []


@case
def barrier_and_join() -> None:
    r, n = hvd.rank(), hvd.size()
    hvd.barrier()
    # The highest rank joins late; the others keep allreducing meanwhile with zeros from
    # the joined ranks... here everyone joins, and the last one is reported everywhere.
    if r == n - 1:
        time.sleep(1.0)  # generous, so the others have joined even on a loaded machine
    last = hvd.join()
    assert last == n - 1, f"join returned {last}, expected {n - 1}"
    hvd.barrier()


@case
def join_with_uneven_work() -> None:
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        return
    # Rank 0 does one more allreduce than the others; the joined ranks contribute zeros.
    steps = 2 if r == 0 else 1
    results = []
    for i in range(steps):
        results.append(hvd.allreduce(torch.ones(3) * (r + 1), op=hvd.Sum, name=f"uneven.{i}"))
    last = hvd.join()
    check_close(results[0], np.full(3, sum(k + 1 for k in range(n))), "allreduce before join")
    if r == 0:
        check_close(results[1], np.full(3, 1.0), "allreduce while others joined")
    assert last == 0, f"last joined rank {last} != 0"


@case
def mismatch_errors_then_recovers() -> None:
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        return
    x = torch.ones(3 + r)
    try:
        hvd.allreduce(x, name="bad_shape")
    except hvd.HorovodInternalError as e:
        msg = str(e)
        assert "bad_shape" in msg, msg
    else:
        raise AssertionError("mismatched shapes must raise HorovodInternalError on every rank")
    assert issubclass(hvd.HorovodInternalError, hvd.HvdliteError) or \
        hvd.HorovodInternalError is hvd.HvdliteError
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after_error")
    check_close(out, np.full(3, float(n)), "allreduce after an error")


if __name__ == "__main__":
    run_cases()
