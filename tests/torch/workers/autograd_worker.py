"""Gradients of the differentiable collectives against hand-derived NumPy references.

Rank ``r`` computes ``loss_r = sum(op(x_r) * w_r)`` with a rank-dependent weight
``w_r``; every rank knows every ``x_k`` and ``w_k``, so the gradient each rank should
receive is a NumPy expression of them (Horovod's documented gradients).
"""
from __future__ import annotations

import numpy as np
import torch

import hvdlite.torch as hvd
from _wcommon import all_ranks, case, check_close, rank_data, run_cases


def leaf(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


@case
def allreduce_grad() -> None:
    r, n = hvd.rank(), hvd.size()
    xs, ws = all_ranks((3, 2), seed=1), all_ranks((3, 2), seed=2)
    for op, want in [(hvd.Sum, np.sum(ws, 0)), (hvd.Average, np.mean(ws, 0))]:
        x = leaf(xs[r])
        y = hvd.allreduce(x, op=op, name=f"g.ar.{op}")
        (y * torch.from_numpy(ws[r])).sum().backward()
        check_close(x.grad, want, f"allreduce op={op} gradient")
    # Scale factors go into the gradient too.
    x = leaf(xs[r])
    y = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5, name="g.scaled")
    (y * torch.from_numpy(ws[r])).sum().backward()
    check_close(x.grad, np.sum(ws, 0), "scaled allreduce gradient")
    # Max: the summed gradient goes to the rank(s) holding the maximum.
    x = leaf(xs[r] + 0.001 * r)  # break ties
    y = hvd.allreduce(x, op=hvd.Max, name="g.max")
    (y * torch.from_numpy(ws[r])).sum().backward()
    vals = np.stack([xs[k] + 0.001 * k for k in range(n)])
    want = np.sum(ws, 0) * (vals.argmax(0) == r)
    check_close(x.grad, want, "allreduce Max gradient")
    # Grouped.
    a, b = leaf(xs[r]), leaf(ws[r])
    ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    (ya * 2 + yb * 3).sum().backward()
    check_close(a.grad, np.full((3, 2), 2.0 * n), "grouped_allreduce gradient 0")
    check_close(b.grad, np.full((3, 2), 3.0 * n), "grouped_allreduce gradient 1")


@case
def allgather_grad() -> None:
    r, n = hvd.rank(), hvd.size()
    rows = [k + 1 for k in range(n)]
    xs = [rank_data(k, (rows[k], 2), seed=3) for k in range(n)]
    total = sum(rows)
    ws = [rank_data(k, (total, 2), seed=4) for k in range(n)]
    x = leaf(xs[r])
    y = hvd.allgather(x, name="g.ag")
    check_close(y, np.concatenate(xs), "allgather forward")
    (y * torch.from_numpy(ws[r])).sum().backward()
    off = sum(rows[:r])
    # Horovod's allgather gradient: the average over ranks of the incoming gradients.
    check_close(x.grad, np.mean(ws, 0)[off:off + rows[r]], "allgather gradient")

    # Grouped, unnamed, with a second tensor whose row counts run the other way.
    rows2 = [n - k for k in range(n)]
    zs = [rank_data(k, (rows2[k], 3), seed=7) for k in range(n)]
    vs = [rank_data(k, (sum(rows2), 3), seed=8) for k in range(n)]
    x, z = leaf(xs[r]), leaf(zs[r])
    gy, gz = hvd.grouped_allgather([x, z])
    check_close(gz, np.concatenate(zs), "grouped_allgather forward")
    ((gy * torch.from_numpy(ws[r])).sum() + (gz * torch.from_numpy(vs[r])).sum()).backward()
    off2 = sum(rows2[:r])
    check_close(x.grad, np.mean(ws, 0)[off:off + rows[r]], "grouped_allgather gradient 0")
    check_close(z.grad, np.mean(vs, 0)[off2:off2 + rows2[r]], "grouped_allgather gradient 1")


@case
def broadcast_grad() -> None:
    r, n = hvd.rank(), hvd.size()
    xs, ws = all_ranks((4,), seed=5), all_ranks((4,), seed=6)
    root = n - 1
    x = leaf(xs[r])
    y = hvd.broadcast(x, root, name="g.bc")
    check_close(y, xs[root], "broadcast forward")
    (y * torch.from_numpy(ws[r])).sum().backward()
    want = np.mean(ws, 0) if r == root else np.zeros(4)
    check_close(x.grad, want, "broadcast gradient")


@case
def alltoall_grad() -> None:
    r, n = hvd.rank(), hvd.size()
    splits = [[(k + j) % 3 + 1 for j in range(n)] for k in range(n)]
    xs = [rank_data(k, (sum(splits[k]), 2), seed=7) for k in range(n)]
    recv = [[splits[k][j] for k in range(n)] for j in range(n)]  # rows rank j receives from k
    ws = [rank_data(k, (sum(recv[k]), 2), seed=8) for k in range(n)]
    x = leaf(xs[r])
    y, received = hvd.alltoall(x, splits=splits[r], name="g.a2a")
    assert received.tolist() == recv[r]
    (y * torch.from_numpy(ws[r])).sum().backward()
    # Row block sent from r to j comes back from w_j at the offset of r's block in j's output.
    want = []
    for j in range(n):
        off = sum(recv[j][:r])
        want.append(ws[j][off:off + splits[r][j]])
    check_close(x.grad, np.concatenate(want), "alltoall gradient")
    # Without splits the result is a single tensor.
    x2 = leaf(rank_data(r, (2 * n, 1), seed=9))
    y2 = hvd.alltoall(x2)
    assert isinstance(y2, torch.Tensor)
    y2.sum().backward()
    check_close(x2.grad, np.ones((2 * n, 1)), "alltoall (even) gradient")


@case
def reducescatter_grad() -> None:
    r, n = hvd.rank(), hvd.size()
    rows = 2 * n + 1
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    xs = all_ranks((rows, 2), seed=10)
    ws = [rank_data(k, (counts[k], 2), seed=11) for k in range(n)]
    # Horovod's convention: the gathered gradient times the number of ranks for Sum, the
    # gathered gradient for Average (their forward differs by that factor).
    for op, scale, gscale in [(hvd.Sum, 1.0, float(n)), (hvd.Average, 1.0 / n, 1.0)]:
        x = leaf(xs[r])
        y = hvd.reducescatter(x, op=op, name=f"g.rs.{op}")
        start = sum(counts[:r])
        ref = np.sum(xs, 0) * scale
        check_close(y, ref[start:start + counts[r]], f"reducescatter op={op} forward")
        (y * torch.from_numpy(ws[r])).sum().backward()
        check_close(x.grad, np.concatenate(ws) * gscale, f"reducescatter op={op} gradient")

    # Grouped: each input's gradient is its own output gradient gathered from every rank.
    ys = all_ranks((n, 3), seed=12)
    vs = [rank_data(k, (1, 3), seed=13) for k in range(n)]
    for op, scale in [(hvd.Sum, float(n)), (hvd.Average, 1.0)]:
        x, z = leaf(xs[r]), leaf(ys[r])
        gx, gz = hvd.grouped_reducescatter([x, z], name=f"g.grs.{op}", op=op,
                                           prescale_factor=2.0)
        (gx * torch.from_numpy(ws[r])).sum().add_((gz * torch.from_numpy(vs[r])).sum()).backward()
        check_close(x.grad, np.concatenate(ws) * 2 * scale, f"grouped_reducescatter op={op} gradient 0")
        check_close(z.grad, np.concatenate(vs) * 2 * scale, f"grouped_reducescatter op={op} gradient 1")


if __name__ == "__main__":
    run_cases()
