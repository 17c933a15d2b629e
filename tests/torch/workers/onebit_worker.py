"""hvdlite.torch.OneBitAdam and DistributedOptimizer's Compression.topk (error feedback)
on 2 or 3 ranks (run by test_onebit.py). Prints ``PASS <case> rank <r>``."""
from __future__ import annotations

import copy
import warnings

import numpy as np
import torch
import torch.nn.functional as F

import hvdlite.torch as hvd
from _wcommon import case, run_cases
from hvdlite.torch.onebit import _bits_with_torch, _pack_with_torch, pack_signs, unpack_signs


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.Tanh(), torch.nn.Linear(48, 4))


def task(steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable task: a fixed random teacher's labels, different inputs on each rank."""
    torch.manual_seed(99)
    teacher = torch.nn.Linear(16, 4)
    g = torch.Generator().manual_seed(1000 * seed + hvd.rank())
    with torch.no_grad():
        return [(x, teacher(x).argmax(1)) for x in (torch.randn(32, 16, generator=g) for _ in range(steps))]


def train(model, opt, data) -> list[float]:
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def max_diff(a, b) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@case
def signs_pack_and_unpack() -> None:
    g = torch.Generator().manual_seed(5)
    for n in (8, 64, 8 * 1001):
        x = torch.randn(n, generator=g)
        x[::7] = 0.0                                    # zero counts as +1
        packed = pack_signs(x)
        assert packed.dtype == torch.uint8 and packed.numel() == n // 8
        want = np.where(x.numpy() >= 0, 1.0, -1.0)
        assert np.array_equal(unpack_signs(packed, torch.float32).numpy(), want)
        # The first element is the highest bit of the first byte.
        assert int(packed[0]) >> 7 == int(x[0] >= 0)
        # The tensor-operation path (taken on GPUs) packs the same bits.
        assert torch.equal(_pack_with_torch(x), packed)
        assert torch.equal(_bits_with_torch(packed).to(torch.float32) * 2 - 1, unpack_signs(packed, torch.float32))


@case
def warm_up_is_adam() -> None:
    """Before freeze_step, OneBitAdam is Adam on averaged gradients."""
    m1, m2 = net(), net()
    # Each group with its own lr, betas and eps; the third added after construction.
    second = {"lr": 0.003, "betas": (0.8, 0.99), "eps": 1e-3}
    third = {"lr": 0.02, "betas": (0.5, 0.9), "eps": 1e-6}
    groups1 = [{"params": list(m1[0].parameters())}, {"params": [m1[2].weight], **second}]
    groups2 = [{"params": list(m2[0].parameters())}, {"params": [m2[2].weight], **second}]
    o1 = hvd.OneBitAdam(groups1, lr=0.01, freeze_step=100)
    o1.add_param_group({"params": [m1[2].bias], **third})
    adam = torch.optim.Adam(groups2, lr=0.01)
    adam.add_param_group({"params": [m2[2].bias], **third})
    o2 = hvd.DistributedOptimizer(adam, named_parameters=m2.named_parameters())
    data = task(15)
    train(m1, o1, data)
    train(m2, o2, data)
    assert max_diff(m1, m2) <= 1e-5, max_diff(m1, m2)
    try:
        o1.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    except ValueError as exc:
        assert "before the first step" in str(exc), exc
    else:
        raise AssertionError("a group added after stepping was accepted")


@case
def per_group_betas_after_the_freeze() -> None:
    """Past freeze_step each group's variance stays divided by its own bias correction
    (1 - b2^freeze_step) and offset by its own eps: the frozen denominators of the two
    groups' spans of the flat vector, against their definition."""
    m = net()
    a = {"betas": (0.8, 0.99), "eps": 1e-3}
    b = {"betas": (0.5, 0.9), "eps": 1e-6, "lr": 0.02}
    o = hvd.OneBitAdam([{"params": list(m[0].parameters()), **a},
                        {"params": list(m[2].parameters()), **b}], lr=0.01, freeze_step=4)
    train(m, o, task(10, seed=4))
    st = o.state[next(iter(m.parameters()))]
    assert st["frozen_bias2"] == [1 - 0.99 ** 4, 1 - 0.9 ** 4], st["frozen_bias2"]
    n0 = sum(p.numel() for p in m[0].parameters())
    v = st["exp_avg_sq"]
    assert torch.allclose(o._denom[:n0], (v[:n0] / (1 - 0.99 ** 4)).sqrt() + 1e-3)
    assert torch.allclose(o._denom[n0:], (v[n0:] / (1 - 0.9 ** 4)).sqrt() + 1e-6)
    assert all(torch.isfinite(p).all() for p in m.parameters())


@case
def another_ranks_buffers_are_not_loaded() -> None:
    """broadcast_optimizer_state gives every rank rank 0's state: Adam's moments are
    taken, rank 0's error-feedback buffers are not (they belong to rank 0's momentum and
    chunk): the other ranks' start from zero, with a warning."""
    data = task(12, seed=3)
    m = net()
    o = hvd.OneBitAdam(m.parameters(), lr=0.01, freeze_step=4)
    train(m, o, data)
    assert o.worker_error.abs().sum() > 0 and o.server_error.abs().sum() > 0
    mine = o.worker_error.clone(), o.server_error.clone()
    moments = o.state[next(iter(m.parameters()))]["exp_avg"].clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.broadcast_optimizer_state(o, root_rank=0)
    said = [str(w.message) for w in caught if "error-feedback" in str(w.message)]
    got = o.state[next(iter(m.parameters()))]["exp_avg"]
    root = hvd.broadcast(moments, 0, name="onebit.root_moments")
    assert torch.equal(got, root)
    if hvd.rank() == 0:
        assert torch.equal(o.worker_error, mine[0]) and torch.equal(o.server_error, mine[1]) and not said
    else:
        assert o.worker_error.abs().sum() == 0 and o.server_error.abs().sum() == 0
        assert len(said) == 1 and "starts its own from zero" in said[0], said
    train(m, o, task(3, seed=5))       # and it goes on


def reference_average(xs: list[np.ndarray], werrs: list[np.ndarray], serrs: list[np.ndarray]):
    """The two-phase 1-bit average in NumPy, for every rank at once: returns the result
    and the new worker and server errors."""
    n, length = len(xs), len(xs[0])
    chunk = length // n

    def comp(v: np.ndarray):
        scale = np.sqrt((v.astype(np.float64) ** 2).sum() / v.size)
        q = np.where(v >= 0, 1.0, -1.0) * scale
        return q, v - q

    q1, new_w = zip(*[comp(x + e) for x, e in zip(xs, werrs)])
    out, new_s = [], []
    for j in range(n):
        y = np.mean([q[j * chunk:(j + 1) * chunk] for q in q1], 0) + serrs[j]
        q2, err = comp(y)
        out.append(q2)
        new_s.append(err)
    return np.concatenate(out), list(new_w), new_s


@case
def compressed_average_matches_its_definition() -> None:
    """One exchange against a NumPy implementation of the two phases, over several calls
    (so the error buffers are exercised), and every rank gets the same result."""
    n, me = hvd.size(), hvd.rank()
    length = 8 * n * 5
    model = torch.nn.Linear(length, 1, bias=False)  # `length` parameters
    opt = hvd.OneBitAdam(model.parameters(), lr=0.1, freeze_step=0)
    werrs = [np.zeros(length) for _ in range(n)]
    serrs = [np.zeros(length // n) for _ in range(n)]
    for call in range(6):
        xs = [np.random.default_rng(10 * call + r).standard_normal(length).astype(np.float32) for r in range(n)]
        got = opt._compressed_average(torch.from_numpy(xs[me].copy())).numpy()
        want, werrs, serrs = reference_average(xs, werrs, serrs)
        assert np.allclose(got, want, atol=1e-5), (call, np.abs(got - want).max())
        assert np.allclose(opt.worker_error.numpy(), werrs[me], atol=1e-5)
        assert np.allclose(opt.server_error.numpy(), serrs[me], atol=1e-5)
        everyone = hvd.allgather_object(got)
        assert all(np.array_equal(other, got) for other in everyone)


@case
def error_feedback_keeps_the_average() -> None:
    """With the same inputs every call, the outputs' running mean approaches the true
    average: what the 1-bit code loses one call is sent in the next."""
    n, me = hvd.size(), hvd.rank()
    length = 8 * n * 32
    x = torch.from_numpy(np.random.default_rng(me).standard_normal(length).astype(np.float32))
    true = np.mean([np.random.default_rng(r).standard_normal(length).astype(np.float32) for r in range(n)], 0)
    model = torch.nn.Linear(length, 1, bias=False)
    opt = hvd.OneBitAdam(model.parameters(), lr=0.1, freeze_step=0)
    total = np.zeros(length)
    calls = 200
    for _ in range(calls):
        total += opt._compressed_average(x.clone()).numpy()
    one_call = np.abs(opt._compressed_average(x.clone()).numpy() - true).mean()
    drift = np.abs(total / calls - true).mean()
    assert drift < 0.05 * np.abs(true).mean() and drift < one_call / 10, (drift, one_call)


@case
def trains_like_adam() -> None:
    """A teacher task, 20 % warm-up: the final loss is within 10 % of Adam's."""
    data = task(150, seed=1)
    m1, m2 = net(), net()
    l1 = train(m1, hvd.OneBitAdam(m1.parameters(), lr=0.01, freeze_step=30), data)
    l2 = train(m2, hvd.DistributedOptimizer(torch.optim.Adam(m2.parameters(), lr=0.01),
                                            named_parameters=m2.named_parameters()), data)
    final1 = float(hvd.allreduce(torch.tensor([np.mean(l1[-15:])]), name="onebit.final1").item())
    final2 = float(hvd.allreduce(torch.tensor([np.mean(l2[-15:])]), name="onebit.final2").item())
    assert final2 < 0.6 * np.mean(l2[:5]), "Adam itself did not learn the task"
    assert final1 <= 1.1 * final2, (final1, final2)
    everyone = hvd.allgather_object([p.detach().clone() for p in m1.parameters()])
    assert all(torch.equal(a, b) for other in everyone for a, b in zip(other, m1.parameters()))


@case
def state_dict_resumes_the_compression() -> None:
    data = task(30, seed=2)
    m1 = net()
    o1 = hvd.OneBitAdam(m1.parameters(), lr=0.01, freeze_step=5)
    train(m1, o1, data[:12])
    sd = copy.deepcopy(o1.state_dict())    # as a checkpoint file would hold it
    assert sd["onebit"]["rank"] == hvd.rank() and sd["onebit"]["worker_error"].abs().sum() > 0
    m2 = net()
    m2.load_state_dict(m1.state_dict())
    o2 = hvd.OneBitAdam(m2.parameters(), lr=0.5, freeze_step=5)
    o2.load_state_dict(sd)
    train(m1, o1, data[12:])
    train(m2, o2, data[12:])
    assert max_diff(m1, m2) == 0.0, max_diff(m1, m2)


@case
def bad_input_is_refused() -> None:
    m = net()
    for kwargs, kind in (({"lr": -1.0}, ValueError), ({"freeze_step": -3}, ValueError),
                         ({"betas": (1.0, 0.9)}, ValueError)):
        try:
            hvd.OneBitAdam(m.parameters(), **kwargs)
        except kind:
            pass
        else:
            raise AssertionError(f"{kwargs} was accepted")
    try:
        hvd.OneBitAdam(net().double().parameters())
    except TypeError as exc:
        assert "float32" in str(exc)
    else:
        raise AssertionError("float64 parameters were accepted")
    s = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="onebit.after_errors")
    assert torch.equal(s, torch.full((2,), float(hvd.size())))


def topk_reference(coefs: list[np.ndarray], residuals: list[np.ndarray], k: int):
    """Every rank's top-k pick of coefficient + residual, summed; new residuals."""
    total = np.zeros_like(coefs[0])
    new = []
    for c, r in zip(coefs, residuals):
        acc = c + r
        idx = np.argsort(-np.abs(acc), kind="stable")[:k]
        total[idx] += acc[idx]
        acc = acc.copy()
        acc[idx] = 0
        new.append(acc)
    return total, new


@case
def topk_sends_the_largest_and_keeps_the_rest() -> None:
    """SGD (lr 1, op=Sum) through DistributedOptimizer with Compression.topk(0.25): each
    step subtracts the sum over ranks of each rank's 4 largest |gradient + residual|
    entries, and the residual keeps the others, as a NumPy reference computes."""
    n, me, size = hvd.size(), hvd.rank(), 16
    w = torch.nn.Parameter(torch.zeros(size, dtype=torch.float64))
    comp = hvd.Compression.topk(0.25)
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                   compression=comp, op=hvd.Sum)
    rng = np.random.default_rng(7)
    ref_w = np.zeros(size)
    residuals = [np.zeros(size) for _ in range(n)]
    for step in range(5):
        # Continuous values: no ties among the sums with the residuals, so the top 4
        # are unambiguous.
        coefs = [rng.standard_normal(size) * 10 for r in range(n)]
        opt.zero_grad()
        (w * torch.from_numpy(coefs[me])).sum().backward()
        opt.step()
        total, residuals = topk_reference(coefs, residuals, 4)
        ref_w -= total
        assert np.allclose(w.detach().numpy(), ref_w), (step, w.detach().numpy(), ref_w)
        assert np.allclose(comp.residuals["w"].numpy(), residuals[me]), step
    assert comp.bytes_sent(size, 8, n) == (n - 1) * 4 * 16


@case
def topk_trains() -> None:
    data = task(150, seed=3)
    m1, m2 = net(), net()
    l1 = train(m1, hvd.DistributedOptimizer(torch.optim.SGD(m1.parameters(), lr=0.1, momentum=0.9),
                                            named_parameters=m1.named_parameters(),
                                            compression=hvd.Compression.topk(0.1)), data)
    l2 = train(m2, hvd.DistributedOptimizer(torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9),
                                            named_parameters=m2.named_parameters()), data)
    final1, final2 = np.mean(l1[-15:]), np.mean(l2[-15:])
    assert final1 < 0.6 * np.mean(l1[:5]), (final1, l1[:5])
    assert final1 <= 1.5 * final2, (final1, final2)
    everyone = hvd.allgather_object([p.detach().clone() for p in m1.parameters()])
    assert all(torch.equal(a, b) for other in everyone for a, b in zip(other, m1.parameters()))


@case
def topk_residuals_are_checkpointed() -> None:
    """state_dict() holds this rank's residuals: a run resumed from it (a fresh model,
    optimizer and compressor) takes the same steps as the run that went on. Given rank
    0's state (broadcast_optimizer_state), the other ranks keep the momentum and start
    their residuals from zero, with a warning."""
    def opt(model):
        return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                        named_parameters=model.named_parameters(),
                                        compression=hvd.Compression.topk(0.05))
    data = task(20, seed=6)
    m1 = net()
    o1 = opt(m1)
    train(m1, o1, data[:8])
    sd = copy.deepcopy(o1.state_dict())
    kept = sd["hvdlite_topk"]
    assert kept["rank"] == hvd.rank() and sum(r.abs().sum() for r in kept["residuals"].values()) > 0
    m2 = net()
    m2.load_state_dict(m1.state_dict())
    o2 = opt(m2)
    o2.load_state_dict(sd)
    train(m1, o1, data[8:])
    train(m2, o2, data[8:])
    assert max_diff(m1, m2) == 0.0, max_diff(m1, m2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.broadcast_optimizer_state(o2, root_rank=0)
    said = [str(w.message) for w in caught if "residuals" in str(w.message)]
    left = o2._hvd_compression.residuals
    if hvd.rank() == 0:
        assert not said and torch.equal(left["0.weight"], o1._hvd_compression.residuals["0.weight"])
    else:
        assert not left and len(said) == 1 and "starts its own from zero" in said[0], said
    train(m2, o2, task(3, seed=7))       # and it goes on


@case
def topk_bad_input_is_refused() -> None:
    for ratio in (0, 1.5, -0.1):
        try:
            hvd.Compression.topk(ratio)
        except ValueError:
            pass
        else:
            raise AssertionError(f"ratio {ratio} was accepted")
    m = net()
    for kwargs in ({"groups": 2}, {"op": hvd.Adasum}, {"gradient_predivide_factor": 2.0}):
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(),
                                     compression=hvd.Compression.topk(0.1), **kwargs)
        except ValueError:
            pass
        else:
            raise AssertionError(f"topk with {kwargs} was accepted")
    try:
        hvd.allreduce(torch.ones(4), compression=hvd.Compression.topk(0.5), name="topk.direct")
    except TypeError as exc:
        assert "DistributedOptimizer" in str(exc)
    else:
        raise AssertionError("hvd.allreduce took Compression.topk")
    s = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="topk.after_errors")
    assert torch.equal(s, torch.full((2,), float(hvd.size())))


if __name__ == "__main__":
    run_cases()
