"""broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object.

The root rank's state is rebuilt independently on every rank (same seeds, same steps,
plain PyTorch) and used as the reference.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd
from _wcommon import case, run_cases


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def data(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(6, 5, generator=g), torch.randn(6, 2, generator=g)


def train_plain(model: nn.Module, opt: torch.optim.Optimizer, steps: int, offset: int = 0) -> None:
    for s in range(steps):
        opt.zero_grad()
        x, y = data(offset + s)
        F.mse_loss(model(x), y).backward()
        opt.step()


def assert_same_state(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), f"{what}: state keys {a.keys()} != {b.keys()}"
    for k in a:
        va, vb = a[k], b[k]
        if isinstance(va, torch.Tensor):
            assert torch.equal(va, vb.to(va.dtype)), f"{what}: state {k!r} differs"
        elif isinstance(va, dict):
            assert_same_state(va, vb, f"{what}.{k}")
        else:
            assert va == vb, f"{what}: {k!r}: {va!r} != {vb!r}"


@case
def broadcast_parameters_forms() -> None:
    r = hvd.rank()
    root = hvd.size() - 1
    model = make_model(seed=r)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    want = make_model(seed=root).state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k]), f"state_dict entry {k} differs from root's"
    # named_parameters form, and parameters that require grad keep doing so.
    model2 = make_model(seed=10 + r)
    hvd.broadcast_parameters(model2.named_parameters(), root_rank=0)
    want2 = dict(make_model(seed=10).named_parameters())
    for k, p in model2.named_parameters():
        assert p.requires_grad and torch.equal(p, want2[k]), f"parameter {k} differs"
    # A plain list of tensors (Horovod accepts it): matched by position.
    model3 = make_model(seed=20 + r)
    hvd.broadcast_parameters(list(model3.parameters()), root_rank=root)
    want3 = list(make_model(seed=20 + root).parameters())
    for k, (p, q) in enumerate(zip(model3.parameters(), want3)):
        assert p.requires_grad and torch.equal(p, q), f"parameter #{k} of a plain list differs"
    t = torch.full((2,), float(r))
    hvd.broadcast_parameters([t, ("named", torch.full((3,), float(r)))], root_rank=0)
    assert torch.equal(t, torch.zeros(2)), "a bare tensor in a mixed list"
    try:
        hvd.broadcast_parameters([torch.zeros(2), 3], root_rank=0)
    except ValueError:
        pass
    else:
        raise AssertionError("a list item that is neither a tensor nor a pair must raise")


@case
def optimizer_state_makes_fresh_rank_identical() -> None:
    r = hvd.rank()
    makers = {
        "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
        "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.02, weight_decay=0.1),
    }
    for name, make in makers.items():
        # Rank 0 has trained 3 steps (so its optimizer has state and a decayed lr); the
        # others are fresh, with a different init and no state at all.
        model = make_model(seed=0 if r == 0 else 50 + r)
        opt = make(model.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        if r == 0:
            train_plain(model, opt, 3)
            for _ in range(3):
                sched.step()
        dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(dopt, root_rank=0)

        # Reference: rank 0's history replayed locally.
        ref = make_model(seed=0)
        ref_opt = make(ref.parameters())
        ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
        train_plain(ref, ref_opt, 3)
        for _ in range(3):
            ref_sched.step()
        assert_same_state(dopt.state_dict()["state"], ref_opt.state_dict()["state"], name)
        assert dopt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"], f"{name}: lr"

        # One more identical step everywhere keeps every rank equal to the reference.
        model.train()
        dopt.zero_grad()
        x, y = data(99)
        F.mse_loss(model(x), y).backward()
        dopt.step()
        train_plain(ref, ref_opt, 1, offset=99)
        for (k, p), q in zip(model.named_parameters(), ref.parameters()):
            assert torch.allclose(p, q, rtol=1e-6, atol=1e-7), f"{name}: {k} after a step"


@case
def optimizer_state_cleared_when_root_has_none() -> None:
    r = hvd.rank()
    model = make_model(seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if r != 0:
        train_plain(model, opt, 1)  # non-roots have state, the root has none
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert len(opt.state_dict()["state"]) == 0, "state not cleared to match the root"
    # As in Horovod, an optimizer without state leaves with zero gradients on its
    # trainable parameters (and None on the others).
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    opt = torch.optim.SGD([*make_model(seed=2).parameters(), frozen], lr=0.1, weight_decay=0.5)
    before = [p.detach().clone() for p in opt.param_groups[0]["params"]]
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    params = opt.param_groups[0]["params"]
    assert frozen.grad is None and all(torch.equal(p.grad, torch.zeros_like(p)) for p in params[:-1])
    assert all(torch.equal(p, b) for p, b in zip(params, before)), "parameters moved"


@case
def objects() -> None:
    r, n = hvd.rank(), hvd.size()
    root = n - 1
    obj = {"rank": r, "arr": np.arange(r + 3), "nested": [r, ("x" * r)]}
    got = hvd.broadcast_object(obj, root_rank=root)
    assert got["rank"] == root and np.array_equal(got["arr"], np.arange(root + 3))
    assert got["nested"] == [root, "x" * root]
    assert hvd.broadcast_object(None if r else "root", 0) == "root"
    everyone = hvd.allgather_object({"r": r, "t": torch.full((r + 1,), float(r))})
    assert [e["r"] for e in everyone] == list(range(n))
    for k, e in enumerate(everyone):
        assert torch.equal(e["t"], torch.full((k + 1,), float(k)))
    assert hvd.allgather_object(r * "ab") == [k * "ab" for k in range(n)]


if __name__ == "__main__":
    run_cases()
