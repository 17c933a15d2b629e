"""op=Adasum on 1, 2 or 4 ranks (3 for the error), checked against the formula
``(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b`` applied in NumPy (float64) pairwise up the
same tree (ranks 0+1, 2+3, then the two results). Prints ``PASS <case> rank <r>``."""
from __future__ import annotations

import numpy as np
import torch

import hvdlite as hnp
import hvdlite.torch as hvd
from _wcommon import case, run_cases

hvd.init()
me, n = hvd.rank(), hvd.size()


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ab, aa, bb = a @ b, a @ a, b @ b
    return (1 - ab / (2 * aa) if aa else 1.0) * a + (1 - ab / (2 * bb) if bb else 1.0) * b


def reference(vectors: list[np.ndarray]) -> np.ndarray:
    level = [v.astype(np.float64).ravel() for v in vectors]
    while len(level) > 1:
        level = [combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def data(r: int, shape: tuple[int, ...] = (37, 3), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(100 * seed + r).standard_normal(shape)


TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 3e-2}


@case
def allreduce_matches_formula() -> None:
    for dt, tol in TOL.items():
        x = torch.from_numpy(data(me)).to(dt)
        got = hvd.allreduce(x, op=hvd.Adasum, name=f"adasum.{dt}")
        ref = reference([torch.from_numpy(data(r)).to(dt).double().numpy() for r in range(n)])
        assert got.dtype == dt
        assert np.allclose(got.double().numpy().ravel(), ref, rtol=tol, atol=tol), (dt, got, ref)
    # Equal vectors give the vector back (not n times it); orthogonal ones their sum.
    same = hvd.allreduce(torch.ones(4, dtype=torch.float64), op=hvd.Adasum, name="adasum.same")
    assert torch.equal(same, torch.ones(4, dtype=torch.float64))
    basis = torch.zeros(n, dtype=torch.float64)
    basis[me] = 1.0
    assert torch.equal(hvd.allreduce(basis, op=hvd.Adasum, name="adasum.ortho"), torch.ones(n, dtype=torch.float64))
    # The NumPy front end and pre/postscale.
    got = hnp.allreduce(data(me, seed=1), op=hnp.Adasum, prescale_factor=2.0, postscale_factor=0.5,
                        name="adasum.numpy")
    assert np.allclose(got.ravel(), reference([2 * data(r, seed=1) for r in range(n)]) * 0.5)


@case
def reducescatter_keeps_its_share() -> None:
    x = torch.from_numpy(data(me, (4 * n, 2), seed=2))
    got = hvd.reducescatter(x, op=hvd.Adasum, name="adasum.rs")
    full = reference([data(r, (4 * n, 2), seed=2) for r in range(n)]).reshape(4 * n, 2)
    assert np.allclose(got.numpy(), full[4 * me:4 * me + 4])


@case
def optimizer_combines_the_updates() -> None:
    """DistributedOptimizer(op=Adasum): each rank steps on its own gradients, and the
    Adasum of the updates is applied from the common start."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2).double()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    inputs = [torch.from_numpy(data(r, (8, 5), seed=3)) for r in range(n)]
    model(inputs[me]).pow(2).sum().backward()
    opt.step()
    # Reference: every rank's own SGD update, combined per tensor.
    updates: dict[str, list[np.ndarray]] = {k: [] for k in start}
    for r in range(n):
        ref = torch.nn.Linear(5, 2).double()
        ref.load_state_dict(start)
        ref(inputs[r]).pow(2).sum().backward()
        for k, p in ref.named_parameters():
            updates[k].append((-0.1 * p.grad).numpy())
    for k, p in model.named_parameters():
        want = start[k].numpy().ravel() + reference(updates[k])
        assert np.allclose(p.detach().numpy().ravel(), want, atol=1e-10), (k, p, want)


@case
def on_a_process_set() -> None:
    if n < 4:
        return
    for ps in (hvd.add_process_set([0, 2]), hvd.add_process_set([1, 3])):
        if ps.included():
            got = hvd.allreduce(torch.from_numpy(data(me, seed=4)), op=hvd.Adasum, name="adasum.set", process_set=ps)
            assert np.allclose(got.numpy().ravel(), reference([data(r, seed=4) for r in ps.ranks]))


@case
def refused_where_it_cannot_run() -> None:
    # Integers: refused on every rank, naming the dtype; the next collective works.
    try:
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum, name="adasum.int")
        raise AssertionError("no error")
    except hvd.HorovodInternalError as exc:
        assert "Adasum takes float16, float32 or float64" in str(exc), exc
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="adasum.after").item() == n


@case
def not_a_power_of_two() -> None:
    try:
        hvd.allreduce(torch.ones(3), op=hvd.Adasum, name="adasum.three")
        raise AssertionError("no error")
    except hvd.HorovodInternalError as exc:
        assert f"Adasum needs a power-of-2 number of ranks (1, 2, 4, 8, ...); this one has {n}" in str(exc), exc
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="three.after").item() == n


# The cases named on the command line (the test picks them by the number of ranks).
run_cases()
