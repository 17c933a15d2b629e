"""Input that only one rank cannot use fails the collective on every rank.

In each case the last rank passes a bad input and the others a good one. Every rank
must raise an error that names the problem and the bad rank (the bad rank: also the
TypeError/ValueError/NotImplementedError a Horovod script expects), nobody may be left
waiting, and the next collective -- named, and unnamed, whose generated names must
still agree -- must work.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

import hvdlite.torch as hvd
from _wcommon import case, check_close, run_cases


def expect_refused(what: str, call: Callable[[], Any], needles: tuple[str, ...],
                   bad_type: type[BaseException]) -> None:
    r, n = hvd.rank(), hvd.size()
    bad = n - 1
    try:
        call()
    except hvd.HvdliteError as exc:
        msg = str(exc)
        assert f"rank {bad}: " in msg, f"{what}: the error does not name rank {bad}: {msg}"
        for needle in needles:
            assert needle in msg, f"{what}: {needle!r} missing from the error: {msg}"
        if r == bad:
            assert isinstance(exc, bad_type), \
                f"{what}: rank {r} raised {type(exc).__mro__}, not a {bad_type.__name__}"
    else:
        raise AssertionError(f"{what}: rank {r} raised nothing")
    # The library stays usable, and unnamed calls still agree across ranks.
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name=f"after.{what}")
    check_close(out, np.full(3, float(n)), f"allreduce after {what}")
    out = hvd.allreduce(torch.full((2,), float(r)), op=hvd.Sum)
    check_close(out, np.full(2, float(sum(range(n)))), f"unnamed allreduce after {what}")


def bad_rank() -> bool:
    return hvd.rank() == hvd.size() - 1


def sparse(n: int = 4) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (n,),
                                   check_invariants=True)


@case
def reductions_refuse_tensors_one_rank_cannot_reduce() -> None:
    good = torch.ones(4)
    uint32 = torch.zeros(4, dtype=torch.uint32)
    cases = [
        ("bool.sum", lambda: torch.tensor([True, False, True, True]), hvd.Sum, ("bool",)),
        ("complex.min", lambda: torch.ones(4, dtype=torch.complex64), hvd.Min, ("complex", "Min")),
        ("uint32", lambda: uint32, hvd.Sum, ("torch.uint32", "cannot be reduced")),
        ("sparse", sparse, hvd.Sum, ("sparse",)),
    ]
    for label, make, op, needles in cases:
        mine = make() if bad_rank() else good
        # Every rank passes the same op: Min of the floats is fine, the bad rank's
        # tensor is what cannot be reduced.
        expect_refused(f"allreduce.{label}", lambda: hvd.allreduce(mine, op=op, name=f"ar.{label}"),
                       needles, TypeError)
        expect_refused(f"allreduce_.{label}", lambda: hvd.allreduce_(mine.clone(), op=op),
                       needles, TypeError)
        expect_refused(f"allreduce_async.{label}",
                       lambda: hvd.synchronize(hvd.allreduce_async(mine, op=op)), needles, TypeError)


@case
def reduce_ops_one_rank_asks_for() -> None:
    x = torch.arange(4, dtype=torch.float32)
    for label, op, needles, bad_type in [("unknown", 17, ("unknown reduce op 17",), ValueError)]:
        mine = op if bad_rank() else hvd.Sum
        expect_refused(f"op.{label}", lambda: hvd.allreduce(x, op=mine, name=f"op.{label}"),
                       needles, bad_type)
        expect_refused(f"op.{label}.unnamed", lambda: hvd.allreduce(x, op=mine), needles, bad_type)
        expect_refused(f"op.{label}.group",
                       lambda: hvd.grouped_allreduce([x, x + 1], op=mine, name=f"gop.{label}"),
                       needles, bad_type)
        expect_refused(f"op.{label}.reducescatter",
                       lambda: hvd.reducescatter(x.reshape(4, 1), op=mine), ("reducescatter",),
                       ValueError)
    # Min on one rank, Sum on the others: Min is an op reducescatter does not run.
    mine = hvd.Min if bad_rank() else hvd.Sum
    expect_refused("reducescatter.min", lambda: hvd.reducescatter(x.reshape(4, 1), op=mine,
                                                                   name="rs.min"),
                   ("Sum, Average and Adasum", "Min"), ValueError)


@case
def groups_fail_whole_when_one_member_is_bad() -> None:
    good = [torch.ones(3), torch.ones(5)]
    mine = [good[0], torch.tensor([True, False])] if bad_rank() else good
    expect_refused("grouped_allreduce",
                   lambda: hvd.grouped_allreduce(mine, op=hvd.Sum, name="group.bool"),
                   ("bool",), TypeError)
    expect_refused("grouped_allreduce.unnamed.async",
                   lambda: hvd.synchronize(hvd.grouped_allreduce_async(mine, op=hvd.Sum)),
                   ("bool",), TypeError)
    gathered = [torch.ones(2), sparse() if bad_rank() else torch.ones(3)]
    expect_refused("grouped_allgather", lambda: hvd.grouped_allgather(gathered, name="gag"),
                   ("sparse",), TypeError)
    scattered = [torch.ones(4, 2), torch.tensor([[True]] * 4) if bad_rank() else torch.ones(4, 1)]
    expect_refused("grouped_reducescatter",
                   lambda: hvd.grouped_reducescatter(scattered, op=hvd.Sum), ("bool",), TypeError)


@case
def moves_refuse_what_one_rank_cannot_send() -> None:
    n = hvd.size()
    t = sparse() if bad_rank() else torch.ones(4)
    expect_refused("broadcast.sparse", lambda: hvd.broadcast(t, 0, name="bcast.sparse"),
                   ("sparse",), TypeError)
    expect_refused("allgather.sparse", lambda: hvd.allgather(t), ("sparse",), TypeError)
    rows = torch.ones(2 * n, 3)
    splits = ["two", "rows"] + [2] * (n - 2) if bad_rank() else [2] * n
    expect_refused("alltoall.splits", lambda: hvd.alltoall(rows, splits=splits, name="a2a.splits"),
                   ("splits must be a sequence of integers",), ValueError)
    expect_refused("alltoall_async.splits",
                   lambda: hvd.synchronize(hvd.alltoall_async(rows, splits=splits)),
                   ("splits must be a sequence of integers",), ValueError)


@case
def sparse_allreduce_refuses_an_op_one_rank_asks_for() -> None:
    op = hvd.Max if bad_rank() else hvd.Sum
    expect_refused("sparse_allreduce",
                   lambda: hvd.synchronize(hvd.sparse_allreduce_async(sparse(), "sparse.max", op)),
                   ("only Sum and Average", "Max"), NotImplementedError)


@case
def every_rank_passing_bad_input_raises_the_same_way() -> None:
    # Not only one rank: every rank refuses, and every rank names them all.
    n = hvd.size()
    try:
        hvd.allreduce(torch.tensor([True]), op=hvd.Sum, name="all.bool")
    except TypeError as exc:
        assert isinstance(exc, hvd.HvdliteError), type(exc).__mro__
        for k in range(n):
            assert f"rank {k}: " in str(exc), str(exc)
    else:
        raise AssertionError("bool Sum on every rank raised nothing")
    check_close(hvd.allreduce(torch.ones(1), op=hvd.Sum), np.full(1, float(n)), "allreduce after")


if __name__ == "__main__":
    run_cases()
