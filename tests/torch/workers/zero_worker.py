"""hvdlite.torch.ZeroRedundancyOptimizer on 2 or 3 ranks (run by test_zero.py).

Each case trains the same model twice from the same start on the same per-rank data:
once through ZeroRedundancyOptimizer and once through DistributedOptimizer over the
same torch optimizer (whose own tests check it against single-process training), and
compares the parameters; other cases check the shards, the state dict, an LR scheduler,
a group added mid-training, and the errors. Prints ``PASS <case> rank <r>``.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

import hvdlite.torch as hvd
from hvdlite.torch.zero import ALIGN
from _wcommon import case, run_cases

TOL = 1e-5


class Net(torch.nn.Module):
    """Layers of several sizes, one parameter no rank uses and one only rank 0 uses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(12, 40)
        self.b = torch.nn.Linear(40, 40)
        self.c = torch.nn.Linear(40, 24)
        self.d = torch.nn.Linear(24, 5)
        self.unused = torch.nn.Parameter(torch.randn(7))
        self.rank0_only = torch.nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.d(torch.relu(self.c(torch.relu(self.b(torch.relu(self.a(x)))))))
        if hvd.rank() == 0:
            y = y + self.rank0_only
        return y


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + hvd.rank())
    return [(torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)) for _ in range(steps)]


def train(model: torch.nn.Module, opt, data, scheduler=None) -> None:
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def groups(model: Net) -> list[dict]:
    """Two groups with their own learning rates."""
    first = [model.a.weight, model.a.bias, model.b.weight, model.unused]
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    return [{"params": first}, {"params": rest, "lr": 0.003}]


def max_diff(m1: torch.nn.Module, m2: torch.nn.Module) -> float:
    return max((a - b).abs().max().item() for a, b in zip(m1.parameters(), m2.parameters()))


def pair(optimizer_class, op=hvd.Average, backward_passes_per_step=1, stage=1, offload_optimizer=None, **kw):
    """(model, ZeRO at ``stage``), (model, DistributedOptimizer) from the same start."""
    mz, md = Net(), Net()
    oz = hvd.ZeroRedundancyOptimizer(groups(mz), optimizer_class=optimizer_class, op=op, stage=stage,
                                     bucket_cap_mb=0.004, backward_passes_per_step=backward_passes_per_step,
                                     offload_optimizer=offload_optimizer, **kw)
    od = hvd.DistributedOptimizer(optimizer_class(groups(md), **kw), named_parameters=md.named_parameters(),
                                  op=op, backward_passes_per_step=backward_passes_per_step)
    return (mz, oz), (md, od)


@case
def adam_matches_distributed_optimizer() -> None:
    (mz, oz), (md, od) = pair(torch.optim.Adam, lr=0.01)
    assert len(oz._buckets) > 2, "the test wants several buckets"
    data = batches(12)
    train(mz, oz, data)
    train(md, od, data)
    assert max_diff(mz, md) <= TOL, max_diff(mz, md)
    start = Net()
    assert (mz.a.weight - start.a.weight).abs().max() > 1e-3, "the parameters did not move"
    assert torch.equal(mz.unused, start.unused), "a parameter without gradients on any rank moved"
    # Every rank holds the same parameters.
    gathered = hvd.allgather_object([p.detach().clone() for p in mz.parameters()])
    for other in gathered:
        assert all(torch.equal(a, b) for a, b in zip(other, mz.parameters()))


@case
def sgd_momentum_with_sum_matches() -> None:
    (mz, oz), (md, od) = pair(torch.optim.SGD, op=hvd.Sum, lr=0.01, momentum=0.9, weight_decay=1e-3)
    data = batches(8)
    train(mz, oz, data)
    train(md, od, data)
    assert max_diff(mz, md) <= TOL, max_diff(mz, md)


@case
def clip_grad_norm_matches_clipping_the_averaged_gradients() -> None:
    """ZeRO's clip_grad_norm_ against Horovod's recipe for DistributedOptimizer (synchronize,
    torch's clip_grad_norm_ over every parameter, step without synchronizing again): the
    same norms on every rank and the same parameters, for the 2-norm and the inf-norm;
    max_norm small enough that every step clips."""
    for norm_type in (2.0, float("inf")):
        (mz, oz), (md, od) = pair(torch.optim.Adam, lr=0.01)
        for x, y in batches(6):
            oz.zero_grad()
            F.cross_entropy(mz(x), y).backward()
            nz = oz.clip_grad_norm_(0.05, norm_type=norm_type)
            oz.step()
            od.zero_grad()
            F.cross_entropy(md(x), y).backward()
            od.synchronize()
            nd = torch.nn.utils.clip_grad_norm_(md.parameters(), 0.05, norm_type=norm_type)
            with od.skip_synchronize():
                od.step()
            assert float(nd) > 0.05, float(nd)                      # it did clip
            assert abs(float(nz) - float(nd)) <= 1e-5 * float(nd), (norm_type, float(nz), float(nd))
            assert len(set(hvd.allgather_object(round(float(nz), 9)))) == 1
        assert max_diff(mz, md) <= TOL, (norm_type, max_diff(mz, md))
    # A backward after the clip and before step() is refused (its gradients would be lost).
    x, y = batches(1)[0]
    oz.zero_grad()
    F.cross_entropy(mz(x), y).backward()
    oz.clip_grad_norm_(1.0)
    try:
        F.cross_entropy(mz(x), y).backward()
    except RuntimeError as exc:
        assert "before step()" in str(exc), exc
    else:
        raise AssertionError("a backward pass after clip_grad_norm_ and before step() was accepted")
    oz.step()


@case
def accumulation_over_backward_passes_matches() -> None:
    """backward_passes_per_step=3 against DistributedOptimizer's: three batches per step,
    their gradients summed locally, then reduced; a fourth pass is refused."""
    (mz, oz), (md, od) = pair(torch.optim.Adam, lr=0.01, backward_passes_per_step=3)
    data = batches(12)
    for model, opt in ((mz, oz), (md, od)):
        for step in range(4):
            opt.zero_grad()
            for x, y in data[3 * step:3 * step + 3]:
                F.cross_entropy(model(x), y).backward()
            opt.step()
    assert max_diff(mz, md) <= TOL, max_diff(mz, md)
    oz.zero_grad()
    x, y = data[0]
    try:
        for _ in range(4):
            F.cross_entropy(mz(x), y).backward()
    except RuntimeError as exc:
        assert "backward_passes_per_step=3" in str(exc), exc
    else:
        raise AssertionError("a fourth backward pass was accepted")
    oz.step()


def _adam_state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if torch.is_tensor(v) and v.dim() > 0)


@case
def shards_are_even_and_disjoint() -> None:
    """Layers of equal size, and a model whose embedding (tied to the output layer) is
    most of its parameters: each rank's Adam state is at most 1/N of the whole plus one
    alignment unit, the shards cover every element once, and the step equals Adam's."""
    n = hvd.size()
    torch.manual_seed(1)
    layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(12)])
    emb = torch.nn.Embedding(1000, 32)
    head = torch.nn.Linear(32, 1000, bias=False)
    head.weight = emb.weight                                    # tied: one parameter
    tied = torch.nn.ModuleDict({"emb": emb, "head": head, "mix": torch.nn.Linear(32, 32)})
    for k, (model, forward) in enumerate(((layers, lambda m: m(torch.randn(4, 64))),
                                          (tied, lambda m: m["head"](m["mix"](m["emb"](torch.arange(6))))))):
        params = list(model.parameters())
        twin = copy.deepcopy(model)
        oz = hvd.ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=1e-3)
        full = torch.optim.Adam(twin.parameters(), lr=1e-3)
        torch.manual_seed(2)
        forward(model).sum().backward()
        torch.manual_seed(2)
        forward(twin).sum().backward()
        for i, p in enumerate(twin.parameters()):        # every rank's gradient, averaged
            p.grad = hvd.allreduce(p.grad, name=f"zero.even.{k}.{i}")
        oz.step()
        full.step()
        assert max_diff(model, twin) <= TOL, max_diff(model, twin)
        total = _adam_state_bytes(full)
        largest = max(p.numel() for p in params) / sum(p.numel() for p in params)
        share = max(hvd.allgather_object(_adam_state_bytes(oz.optim))) / total
        elements = sum(p.numel() for p in params)
        assert share <= 1 / n + ALIGN / elements, (share, largest)
        covered = hvd.allgather_object(sorted((f.lo, f.hi) for fs in oz._flats for f in fs))
        spans = sorted(span for ranks in covered for span in ranks)
        assert sum(hi - lo for lo, hi in spans) == elements, spans       # each element once
        assert (oz.bytes_per_step() > 0) == (n > 1), oz.bytes_per_step()


@case
def stage_2_matches_and_frees_the_gradients() -> None:
    """Stage 2 against DistributedOptimizer, alone and over three backward passes per
    step: the same parameters; a bucket's gradients are gone once it is sent, after each
    pass (a.weight's bucket completes in backward on every rank), and after step() no
    full gradient is left, where stage 1 keeps them."""
    for passes in (1, 3):
        (mz, oz), (md, od) = pair(torch.optim.Adam, lr=0.01, stage=2, backward_passes_per_step=passes)
        data = batches(4 * passes)
        for model, opt in ((mz, oz), (md, od)):
            for step in range(4):
                opt.zero_grad()
                for x, y in data[passes * step:passes * step + passes]:
                    F.cross_entropy(model(x), y).backward()
                    if opt is oz:   # sent and freed after each pass, not only the last
                        assert mz.a.weight.grad is None and mz.a.bias.grad is None, "a sent bucket kept its gradients"
                opt.step()
                if opt is oz:
                    assert all(p.grad is None for p in mz.parameters()), "stage 2 left full gradients"
        assert max_diff(mz, md) <= TOL, (passes, max_diff(mz, md))
    (m1, o1), _ = pair(torch.optim.Adam, lr=0.01, stage=1)
    x, y = batches(1)[0]
    F.cross_entropy(m1(x), y).backward()
    o1.reduce_gradients()
    # Stages 1 and 2 keep no copy of the parameters: the local optimizer steps views into
    # them; at stage 1 the reduced gradients land in the parameters' own.
    storage = {p.untyped_storage().data_ptr(): p for p in m1.parameters()}
    grads = {p.grad.untyped_storage().data_ptr() for p in m1.parameters() if p.grad is not None}
    for piece in o1._pieces():
        assert storage.get(piece.tensor.untyped_storage().data_ptr()) is piece.param, "a copy of a parameter"
        if piece.tensor.grad is not None and piece.param.grad is not None:
            assert piece.tensor.grad.untyped_storage().data_ptr() in grads, "a reduced gradient outside .grad"
    assert all(f.master is None and f.grad is None for fs in o1._flats for f in fs)
    assert all(f.master is None and f.grad is not None for fs in oz._flats for f in fs)
    o1.step()
    assert m1.a.weight.grad is not None, "stage 1 dropped the local gradients"


class Tied(torch.nn.Module):
    """Stage 3's shapes: nested modules, an embedding tied to the output layer, a layer
    called twice in one forward, and a parameter of the root module itself."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.emb = torch.nn.Embedding(60, 16)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(),
                                        torch.nn.Sequential(torch.nn.Linear(24, 16), torch.nn.Tanh()))
        self.twice = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 60, bias=False)
        self.head.weight = self.emb.weight
        self.scale = torch.nn.Parameter(torch.ones(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(self.emb(x)) * self.scale
        return self.head(self.twice(torch.relu(self.twice(h))))


def tokens(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(200 + hvd.rank())
    return [(torch.randint(0, 60, (10,), generator=g), torch.randint(0, 60, (10,), generator=g))
            for _ in range(steps)]


def stage_3_pair(passes: int = 1, dtype: torch.dtype = torch.float32):
    """(model, ZeRO stage 3), (model, DistributedOptimizer(Adam)) from the same start;
    the reference in float32."""
    m = Tied().to(dtype)
    ref = Tied()
    oz = hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=0.01, stage=3,
                                     model=m, bucket_cap_mb=0.002, backward_passes_per_step=passes)
    od = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.01),
                                  named_parameters=ref.named_parameters(), backward_passes_per_step=passes)
    return (m, oz), (ref, od)


def train_lm(model: torch.nn.Module, opt, data, passes: int = 1, after_pass=None) -> None:
    for step in range(len(data) // passes):
        opt.zero_grad()
        for x, y in data[passes * step:passes * step + passes]:
            F.cross_entropy(model(x).float(), y).backward()
            if after_pass is not None:
                after_pass()
        opt.step()


def _no_full_gradients(model: torch.nn.Module) -> None:
    held = [n for n, p in model.named_parameters() if p.grad is not None]
    assert not held, f"full gradients kept after a backward pass: {held}"


@case
def stage_3_matches_and_keeps_only_shards() -> None:
    """Stage 3 against DistributedOptimizer, one and two backward passes per step: the
    same parameters (compared inside gathered_parameters()); between steps every
    parameter is freed and each rank keeps only its shard, and after each backward pass
    no full gradient is left; evaluation under no_grad gives the reference's outputs."""
    n = hvd.size()
    for passes in (1, 2):
        (m, oz), (ref, od) = stage_3_pair(passes)
        data = tokens(4 * passes)
        train_lm(m, oz, data, passes, after_pass=lambda: _no_full_gradients(m))
        train_lm(ref, od, data, passes)
        assert all(p.numel() == 0 for p in m.parameters()), [p.numel() for p in m.parameters()]
        kept = sum(f.master.numel() for fs in oz._flats for f in fs)
        whole = sum(p.numel() for p in ref.parameters())
        assert kept <= whole / n + ALIGN, (kept, whole)
        with oz.gathered_parameters():
            assert max_diff(m, ref) <= TOL, (passes, max_diff(m, ref))
            assert (m.body[0].weight - Tied().body[0].weight).abs().max() > 1e-3, "the parameters did not move"
        assert all(p.numel() == 0 for p in m.parameters())
        x, _ = data[0]
        with torch.no_grad():
            assert (m(x) - ref(x)).abs().max() <= TOL
        assert all(p.numel() == 0 for p in m.parameters())


@case
def stage_3_state_dicts() -> None:
    """The whole optimizer state equals DistributedOptimizer's; the parameters saved
    inside gathered_parameters() are the reference's; a sharded state dict loads into a
    new optimizer on the same rank, which then goes on as the first; another rank's is
    refused; gathered_parameters(modify=True) writes into the shards; a TorchState
    keeps and restores stage 3."""
    (m, oz), (ref, od) = stage_3_pair()
    data = tokens(6)
    train_lm(m, oz, data[:3])
    train_lm(ref, od, data[:3])
    oz.consolidate_state_dict(to=0)
    if hvd.rank() == 0:
        sd, want = oz.state_dict(), od.state_dict()
        assert sorted(sd["state"]) == sorted(want["state"]), (sorted(sd["state"]), sorted(want["state"]))
        for k, st in want["state"].items():
            assert torch.allclose(sd["state"][k]["exp_avg_sq"], st["exp_avg_sq"], atol=TOL), k
    with oz.gathered_parameters():
        saved = {k: v.clone() for k, v in m.state_dict().items()}
    assert all((saved[k] - v).abs().max() <= TOL for k, v in ref.state_dict().items())
    sharded = oz.sharded_state_dict()
    m2 = Tied()
    m2.load_state_dict(saved)
    o2 = hvd.ZeroRedundancyOptimizer(m2.parameters(), optimizer_class=torch.optim.Adam, lr=0.5, stage=3,
                                     model=m2, bucket_cap_mb=0.002)
    o2.load_sharded_state_dict(sharded)
    train_lm(m, oz, data[3:])
    train_lm(m2, o2, data[3:])
    with oz.gathered_parameters(), o2.gathered_parameters():
        assert max_diff(m, m2) <= TOL, max_diff(m, m2)
    # modify=True: what the parameters hold at its end goes into the shards (the tied
    # embedding and output weight are one parameter).
    with o2.gathered_parameters(modify=True):
        with torch.no_grad():
            m2.head.weight.fill_(0.25)
            m2.scale.copy_(torch.arange(16.0))
    assert all(p.numel() == 0 for p in m2.parameters())
    with o2.gathered_parameters():
        assert torch.equal(m2.emb.weight, torch.full((60, 16), 0.25)), m2.emb.weight
        assert torch.equal(m2.scale, torch.arange(16.0)), m2.scale
    _stage_3_in_a_torch_state(m2, o2, data[3:5])
    try:
        o2.add_param_group({"params": [torch.nn.Parameter(torch.ones(3))]})
    except ValueError as exc:
        assert "stage 3" in str(exc), exc
    else:
        raise AssertionError("a group added at stage 3 was accepted")
    wrong = dict(sharded, rank=sharded["rank"] + 1)
    try:
        o2.load_sharded_state_dict(wrong)
    except ValueError as exc:
        assert "cannot load into rank" in str(exc), exc
    else:
        raise AssertionError("another rank's sharded state dict was loaded")


def _stage_3_in_a_torch_state(model: Tied, opt, data) -> None:
    """In a TorchState, restore() goes back to the commit, also after a failure in the
    middle of forward (some parameters gathered): everything is freed, and training
    from there goes as it does from a clean restore."""
    state = hvd.elastic.TorchState(model, opt)
    state.commit()
    with opt.gathered_parameters():
        committed = {k: v.clone() for k, v in model.state_dict().items()}

    def fail(module, args):
        raise RuntimeError("the test's failure in forward")

    handle = model.head.register_forward_pre_hook(fail)
    try:
        model(data[0][0])
    except RuntimeError as exc:
        assert "the test's failure" in str(exc), exc
    else:
        raise AssertionError("the forward did not fail")
    handle.remove()
    assert any(p.numel() for p in model.parameters()), "nothing was gathered when forward failed"
    after = []
    for _ in range(2):
        state.restore()
        assert all(p.numel() == 0 for p in model.parameters()), [p.numel() for p in model.parameters()]
        with opt.gathered_parameters():
            for k, v in model.state_dict().items():
                assert torch.equal(v, committed[k]), f"{k} not restored"
        train_lm(model, opt, data[1:2])
        with opt.gathered_parameters():
            after.append({k: v.clone() for k, v in model.state_dict().items()})
    assert all(torch.equal(after[0][k], after[1][k]) for k in committed), "training after a restore differs"
    assert any(not torch.equal(after[0][k], committed[k]) for k in committed), "the step changed nothing"


@case
def stage_3_bf16_parameters_with_float32_shards() -> None:
    """bf16 parameters: the shards the optimizer steps are float32, the gathered
    parameters bf16, and training follows the float32 reference to bf16's precision."""
    (m, oz), (ref, od) = stage_3_pair(dtype=torch.bfloat16)
    assert all(f.master.dtype == torch.float32 for fs in oz._flats for f in fs)
    data = tokens(4)
    train_lm(m, oz, data)
    train_lm(ref, od, data)
    with oz.gathered_parameters():
        assert all(p.dtype == torch.bfloat16 for p in m.parameters())
        diff = max((a.float() - b).abs().max().item() for a, b in zip(m.parameters(), ref.parameters()))
        assert diff <= 0.05, diff
        moved = (m.body[0].weight.float() - Tied().body[0].weight).abs().max().item()
        assert moved > 0.02, moved


@case
def parameters_changed_after_construction_are_taken() -> None:
    """Horovod's order: the optimizer first, then rank 0's parameters broadcast (each
    rank started from its own); and later parameters changed by the user between steps, in
    place and by giving one new storage.
    ZeRO steps from those values, as DistributedOptimizer does."""
    for stage in (1, 2):
        (mz, oz), (md, od) = pair(torch.optim.Adam, lr=0.01, stage=stage)
        for m in (mz, md):
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(hvd.rank())                  # each rank's own start
            hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        data = batches(4)
        train(mz, oz, data[:2])
        train(md, od, data[:2])
        for m in (mz, md):
            with torch.no_grad():
                m.a.weight.mul_(0.5)
            m.load_state_dict({**m.state_dict(), "b.bias": torch.zeros(40)})
            m.a.bias.data = m.a.bias.data * 0.9                 # new storage for a parameter
        train(mz, oz, data[2:])
        train(md, od, data[2:])
        assert max_diff(mz, md) <= TOL, (stage, max_diff(mz, md))


@case
def state_dict_consolidates_and_loads() -> None:
    to = hvd.size() - 1
    (mz, oz), (md, od) = pair(torch.optim.Adam, lr=0.01)
    data = batches(10)
    train(mz, oz, data[:5])
    train(md, od, data[:5])
    oz.consolidate_state_dict(to=to)
    if hvd.rank() == to:
        sd, ref = oz.state_dict(), od.state_dict()
        assert sorted(sd["state"]) == sorted(ref["state"]), (sorted(sd["state"]), sorted(ref["state"]))
        for k, st in ref["state"].items():
            for key, v in st.items():
                assert torch.allclose(torch.as_tensor(sd["state"][k][key]), torch.as_tensor(v), atol=TOL), (k, key)
        assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in ref["param_groups"]]
        assert [g["lr"] for g in sd["param_groups"]] == [0.01, 0.003]
    else:
        try:
            oz.state_dict()
        except RuntimeError as exc:
            assert "consolidate_state_dict" in str(exc)
        else:
            raise AssertionError("state_dict() answered on a rank it was not consolidated to")
    # A new optimizer loaded from it continues as the first one does.
    sd = hvd.broadcast_object(oz.state_dict() if hvd.rank() == to else None, root_rank=to, name="zero.sd")
    m2 = Net()
    m2.load_state_dict(mz.state_dict())
    o2 = hvd.ZeroRedundancyOptimizer(groups(m2), optimizer_class=torch.optim.Adam, lr=0.5,
                                     bucket_cap_mb=0.004)
    o2.load_state_dict(sd)
    assert [g["lr"] for g in o2.param_groups] == [0.01, 0.003]
    train(mz, oz, data[5:])
    train(m2, o2, data[5:])
    assert max_diff(mz, m2) <= TOL, max_diff(mz, m2)
    # The whole format is also DistributedOptimizer's (and what this optimizer wrote when
    # it gave each rank whole parameters): such a checkpoint loads into the shards.
    m3 = Net()
    m3.load_state_dict(md.state_dict())
    o3 = hvd.ZeroRedundancyOptimizer(groups(m3), optimizer_class=torch.optim.Adam, lr=0.5, stage=2,
                                     bucket_cap_mb=0.004)
    o3.load_state_dict(od.state_dict())
    train(md, od, data[5:])
    train(m3, o3, data[5:])
    assert max_diff(md, m3) <= TOL, max_diff(md, m3)


@case
def lr_scheduler_reaches_the_shards() -> None:
    (mz, oz), (md, od) = pair(torch.optim.Adam, lr=0.01)
    sz = torch.optim.lr_scheduler.StepLR(oz, step_size=2, gamma=0.1)
    sd = torch.optim.lr_scheduler.StepLR(od, step_size=2, gamma=0.1)
    data = batches(6)
    train(mz, oz, data, sz)
    train(md, od, data, sd)
    # The scheduler set 1e-5 after the last step; the shards took each lr at their step.
    assert abs(oz.param_groups[0]["lr"] - 0.01 * 0.1 ** 3) < 1e-12, oz.param_groups[0]["lr"]
    assert abs(oz.optim.param_groups[0]["lr"] - 0.01 * 0.1 ** 2) < 1e-12, oz.optim.param_groups[0]["lr"]
    assert max_diff(mz, md) <= TOL, max_diff(mz, md)


@case
def param_group_added_mid_training() -> None:
    (mz, oz), (md, od) = pair(torch.optim.Adam, lr=0.01)
    extra_z, extra_d = torch.nn.Parameter(torch.ones(9)), torch.nn.Parameter(torch.ones(9))
    data = batches(8)
    train(mz, oz, data[:4])
    train(md, od, data[:4])
    oz.add_param_group({"params": [extra_z], "lr": 0.05})
    od.add_param_group({"params": [extra_d], "lr": 0.05})
    for (x, y), (m, o, e) in [(b, t) for b in data[4:] for t in ((mz, oz, extra_z), (md, od, extra_d))]:
        o.zero_grad()
        (F.cross_entropy(m(x), y) + (e * (hvd.rank() + 1)).sum()).backward()
        o.step()
    assert max_diff(mz, md) <= TOL and (extra_z - extra_d).abs().max() <= TOL
    assert (extra_z - 1).abs().max() > 0.01, "the added group did not train"


@case
def process_set_shards_over_its_ranks() -> None:
    """Over ProcessSet([0, N-1]) ZeRO (stage 1, then 2) shards among those two ranks only
    and equals DistributedOptimizer over the same set; consolidate_state_dict's ``to`` is
    a rank within the set (1: world rank N-1). A rank outside the set is refused with a
    ValueError naming it."""
    n = hvd.size()
    # On 2 ranks [0, 1] is the global set, which cannot be added again (as in Horovod).
    ps = hvd.add_process_set([0, n - 1]) if n > 2 else hvd.global_process_set
    try:
        if not ps.included():
            try:
                hvd.ZeroRedundancyOptimizer(Net().parameters(), optimizer_class=torch.optim.SGD, lr=0.1,
                                            process_group=ps)
            except ValueError as exc:
                assert f"rank {hvd.rank()} is not in" in str(exc), exc
            else:
                raise AssertionError("a rank outside the process set built its optimizer")
            return
        for stage in (1, 2):
            _process_set_case(ps, stage)
        _process_set_stage_3(ps)
    finally:
        if ps is not hvd.global_process_set:
            hvd.remove_process_set(ps)


def _process_set_case(ps, stage: int) -> None:
    """One stage of process_set_shards_over_its_ranks, on a member of the set."""
    mz, md = Net(), Net()
    oz = hvd.ZeroRedundancyOptimizer(groups(mz), optimizer_class=torch.optim.Adam, lr=0.01,
                                     bucket_cap_mb=0.004, process_group=ps, stage=stage)
    od = hvd.DistributedOptimizer(torch.optim.Adam(groups(md), lr=0.01), named_parameters=md.named_parameters(),
                                  process_set=ps)
    assert (oz.rank, oz.world_size) == (ps.rank(), 2), (oz.rank, oz.world_size)
    data = batches(8)
    train(mz, oz, data)
    train(md, od, data)
    assert max_diff(mz, md) <= TOL, (stage, max_diff(mz, md))
    assert (mz.a.weight - Net().a.weight).abs().max() > 1e-3, "the parameters did not move"
    full = sum(v.numel() * v.element_size() for s in od.state.values() for v in s.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0)
    assert oz.state_bytes() < 0.75 * full, (oz.state_bytes(), full)
    oz.consolidate_state_dict(to=1)
    if ps.rank() == 1:
        sd, ref = oz.state_dict(), od.state_dict()
        assert sorted(sd["state"]) == sorted(ref["state"]), (sorted(sd["state"]), sorted(ref["state"]))
        for k, st in ref["state"].items():
            assert torch.allclose(sd["state"][k]["exp_avg"], st["exp_avg"], atol=TOL), k
    try:
        oz.consolidate_state_dict(to=2)
    except ValueError as exc:
        assert "to=2" in str(exc), exc
    else:
        raise AssertionError("consolidate_state_dict(to=2) was accepted on a set of 2")


def _process_set_stage_3(ps) -> None:
    """Stage 3 over the set: equal to DistributedOptimizer over it, on the Tied model
    (stage 3 needs every rank to run the same modules in the same order, which Net's
    rank-0-only parameter breaks)."""
    m, ref = Tied(), Tied()
    oz = hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=0.01, stage=3,
                                     model=m, bucket_cap_mb=0.002, process_group=ps)
    od = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.01),
                                  named_parameters=ref.named_parameters(), process_set=ps)
    data = tokens(4)
    train_lm(m, oz, data)
    train_lm(ref, od, data)
    with oz.gathered_parameters():
        assert max_diff(m, ref) <= TOL, max_diff(m, ref)


class Embedded(torch.nn.Module):
    """A language model whose embedding, tied to the output layer, is 84 % of its
    parameters."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.emb = torch.nn.Embedding(268, 16)
        self.body = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh())
                                          for _ in range(3)])
        self.head = torch.nn.Linear(16, 268, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.emb(x)))


@case
def thirty_steps_reach_distributed_optimizers_eval_loss() -> None:
    """Every stage against DistributedOptimizer(Adam) over 30 steps, on a model whose
    tied embedding is 84 % of it and on one with nested modules and a layer called
    twice: the loss on held-out tokens within 1e-5 relative."""
    for make, vocab in ((Embedded, 268), (Tied, 60)):
        assert make is not Embedded or 0.83 < make().emb.weight.numel() / sum(
            p.numel() for p in make().parameters()) < 0.85
        g = torch.Generator().manual_seed(300 + hvd.rank())
        data = [(torch.randint(0, vocab, (12,), generator=g), torch.randint(0, vocab, (12,), generator=g))
                for _ in range(30)]
        held_out = torch.Generator().manual_seed(999)
        x_eval, y_eval = torch.randint(0, vocab, (64,), generator=held_out), torch.randint(0, vocab, (64,),
                                                                                          generator=held_out)
        ref = make()
        od = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.01),
                                      named_parameters=ref.named_parameters())
        train_lm(ref, od, data)
        with torch.no_grad():
            want = F.cross_entropy(ref(x_eval), y_eval).item()
        for stage in (1, 2, 3):
            m = make()
            oz = hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=0.01, stage=stage,
                                             bucket_cap_mb=0.002, **({"model": m} if stage == 3 else {}))
            train_lm(m, oz, data)
            with torch.no_grad():
                got = F.cross_entropy(m(x_eval), y_eval).item()
            assert abs(got - want) <= 1e-5 * abs(want), (make.__name__, stage, got, want)


def _saved_bytes(root) -> int:
    """Bytes of the distinct storages autograd saved for the graph behind ``root``."""
    seen, storages, todo = set(), {}, [root]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        for name in dir(fn):
            if name.startswith("_saved_"):
                try:
                    v = getattr(fn, name)
                except RuntimeError:      # freed already
                    continue
                if torch.is_tensor(v):
                    st = v.untyped_storage()
                    storages[st.data_ptr()] = st.nbytes()
        todo += [f for f, _ in fn.next_functions]
    return sum(storages.values())


@case
def stage_3_keeps_no_gathered_weights_between_forward_and_backward() -> None:
    """Autograd saves views of the weights it needs for backward (a transposed weight
    for the input's gradient): after forward they hold no memory, since the unit's
    storage is freed in place, and backward gathers it again and gets the same
    gradients as DistributedOptimizer."""
    torch.manual_seed(5)
    width, depth = 96, 6
    make = lambda: torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)])  # noqa: E731
    m, ref = make(), make()
    ref.load_state_dict(m.state_dict())
    whole = sum(p.numel() * p.element_size() for p in m.parameters())
    oz = hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=0.01, stage=3, model=m)
    od = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.01), named_parameters=ref.named_parameters())
    g = torch.Generator().manual_seed(400 + hvd.rank())
    for _ in range(3):
        x = torch.randn(2, width, generator=g)
        for model, opt in ((m, oz), (ref, od)):
            opt.zero_grad()
            loss = model(x).square().mean()
            if opt is oz:
                saved = _saved_bytes(loss.grad_fn)
                assert saved < whole / depth, (saved, whole)       # not even one layer's weight
            loss.backward()
            opt.step()
    with oz.gathered_parameters():
        assert max_diff(m, ref) <= TOL, max_diff(m, ref)
        kept = [p.detach() for p in m.parameters()]
    # What gathered_parameters() gave stays valid after it (it is not freed in place).
    assert all(t.numel() == width * width or t.numel() == width for t in kept)
    assert all(torch.isfinite(t).all() for t in kept)


@case
def deepspeed_configuration_builds_the_same_optimizer() -> None:
    """from_deepspeed_config: DeepSpeed's ZeRO section (bucket sizes in elements,
    overlap_comm off, "auto", settings at the value hvdlite always has) gives an optimizer
    whose buckets and gathers keep those sizes and whose training equals
    DistributedOptimizer's; stage 3 from a JSON file; stage 0 is DistributedOptimizer;
    unsupported settings are refused by name, before any collective."""
    import json
    import os
    import tempfile
    import warnings

    from hvdlite.torch.zero import from_deepspeed_config
    config = {"train_batch_size": 16, "zero_optimization": {
        "stage": 2, "reduce_bucket_size": 300, "allgather_bucket_size": 2000, "overlap_comm": False,
        "contiguous_gradients": True, "reduce_scatter": True, "allgather_partitions": True,
        "offload_optimizer": {"device": "none"}, "sub_group_size": "auto"}}
    mz, md = Net(), Net()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        oz = from_deepspeed_config(mz, torch.optim.Adam, config, lr=0.01)
    assert any("train_batch_size" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert isinstance(oz, hvd.ZeroRedundancyOptimizer) and oz.stage == 2 and not oz.overlap_comm
    for runs, cap in ((oz._buckets, 300), (oz._gathers, 2000)):
        assert all(b.hi - b.lo <= cap or len(b.order) == 1 for b in runs), [(b.hi - b.lo) for b in runs]
    assert len(oz._buckets) > len(oz._gathers) > 1
    od = hvd.DistributedOptimizer(torch.optim.Adam(md.parameters(), lr=0.01), named_parameters=md.named_parameters())
    data = batches(4)
    train(mz, oz, data)
    train(md, od, data)
    assert max_diff(mz, md) <= TOL, max_diff(mz, md)

    # Stage 3 from a file, with DeepSpeed's offload section at device "none".
    m3, ref = Tied(), Tied()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ds.json")
        with open(path, "w") as fh:
            json.dump({"zero_optimization": {"stage": 3, "overlap_comm": True,
                                              "offload_param": {"device": "none"}}}, fh)
        o3 = from_deepspeed_config(m3, torch.optim.Adam, path, lr=0.01)
    assert o3.stage == 3
    od = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.01), named_parameters=ref.named_parameters())
    toks = tokens(3)
    train_lm(m3, o3, toks)
    train_lm(ref, od, toks)
    with o3.gathered_parameters():
        assert max_diff(m3, ref) <= TOL, max_diff(m3, ref)

    o0 = from_deepspeed_config(Net(), torch.optim.SGD, {"stage": 0}, lr=0.1)
    assert not isinstance(o0, hvd.ZeroRedundancyOptimizer) and isinstance(o0, torch.optim.SGD), type(o0)

    for section, named in (({"stage": 3, "stage3_max_live_parameters": 1e9}, "stage3_max_live_parameters"),
                           ({"stage": 2, "offload_param": {"device": "cpu"}}, "offload_param"),
                           ({"stage": 2, "reduce_scatter": False}, "reduce_scatter"),
                           ({"stage": 1, "offload_optimizer": {"device": "nvme"}}, "nvme"),
                           ({"stage": 5}, "stage"),
                           ({"stage": 1, "reduce_bucket_size": 0}, "reduce_bucket_size"),
                           ({"stage": 0, "reduce_bucket_size": 100}, "reduce_bucket_size"),
                           ({"stage": 2, "overlap_comm": "yes"}, "overlap_comm")):
        try:
            from_deepspeed_config(Net(), torch.optim.Adam, {"zero_optimization": section}, lr=0.1)
        except ValueError as exc:
            assert named in str(exc), (section, exc)
        else:
            raise AssertionError(f"{section} was accepted")
    s = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="zero.after_deepspeed_errors")
    assert torch.equal(s, torch.full((2,), float(hvd.size())))


@case
def stage_3_refuses_a_model_changed_after_sharding() -> None:
    """A parameter replaced or added, or the model moved to another dtype, after the
    optimizer sharded it: the next forward is refused, naming the parameters, before any
    gather; put back as it was, the model trains on."""
    m, ref = Tied(), Tied()
    oz = hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.Adam, lr=0.01, stage=3, model=m)
    od = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.01), named_parameters=ref.named_parameters())
    x, _ = tokens(1)[0]
    kept = m.twice.weight

    def replace() -> None:
        m.twice.weight = torch.nn.Parameter(torch.zeros(16, 16))

    def add() -> None:
        m.extra = torch.nn.Linear(16, 16)

    def undo_add() -> None:
        del m.extra

    def undo_replace() -> None:
        m.twice.weight = kept

    for change, undo, named in ((replace, undo_replace, "replaced: twice.weight"),
                                (add, undo_add, "added: extra.bias, extra.weight"),
                                (lambda: m.double(), lambda: m.float(), "moved to another dtype")):
        change()
        try:
            m(x)
        except RuntimeError as exc:
            assert named in str(exc), exc
        else:
            raise AssertionError(f"a forward after the model changed ({named}) was accepted")
        undo()
    toks = tokens(3)
    train_lm(m, oz, toks)
    train_lm(ref, od, toks)
    with oz.gathered_parameters():
        assert max_diff(m, ref) <= TOL, max_diff(m, ref)


@case
def offload_costs_nothing_on_the_cpu_and_its_path_matches() -> None:
    """offload_optimizer="cpu" with CPU parameters: accepted, nothing offloaded, the same
    parameters bit for bit. The offloaded path itself (shards and state in host memory,
    a separate copy of the shard where the parameters live, PyTorch's fused CPU Adam),
    run here with CPU parameters through the module's test switch, gives
    DistributedOptimizer's parameters at stages 1, 2 and 3, with two backward passes at
    stage 2."""
    import hvdlite.torch.zero as zero_module
    (mz, oz), _ = pair(torch.optim.Adam, lr=0.01, stage=2)
    (mo, oo), _ = pair(torch.optim.Adam, lr=0.01, stage=2, offload_optimizer="cpu")
    assert not oo._offloaded() and all(f.device_shard is None for fs in oo._flats for f in fs)
    assert "fused" not in oo.optim.defaults or not oo.optim.defaults["fused"], oo.optim.defaults
    data = batches(3)
    for model, opt in ((mz, oz), (mo, oo)):
        train(model, opt, data)
    assert max_diff(mz, mo) == 0, max_diff(mz, mo)
    zero_module._OFFLOAD_CPU_PARAMETERS = True
    try:
        for stage, passes in ((1, 1), (2, 2)):
            (mz, oz), (md, od) = pair(torch.optim.Adam, lr=0.01, stage=stage, backward_passes_per_step=passes,
                                      offload_optimizer="cpu")
            assert oz._offloaded() and oz.optim.defaults["fused"] is True, oz.optim.defaults
            data = batches(3 * passes)
            for model, opt in ((mz, oz), (md, od)):
                for step in range(3):
                    opt.zero_grad()
                    for x, y in data[passes * step:passes * step + passes]:
                        F.cross_entropy(model(x), y).backward()
                    opt.step()
            assert max_diff(mz, md) <= TOL, (stage, max_diff(mz, md))
            # The gathers send the device copy, which follows the master after each step.
            for f in (f for fs in oz._flats for f in fs):
                assert f.device_shard.data_ptr() != f.master.data_ptr()
                assert torch.equal(f.device_shard, f.master.to(f.dtype)), stage
        _, (ref, od) = stage_3_pair()
        m3 = Tied()
        o3 = hvd.ZeroRedundancyOptimizer(m3.parameters(), optimizer_class=torch.optim.Adam, lr=0.01, stage=3,
                                         model=m3, bucket_cap_mb=0.002, offload_optimizer="cpu")
        assert o3._offloaded()
        data = tokens(3)
        train_lm(m3, o3, data)
        train_lm(ref, od, data)
        with o3.gathered_parameters():
            assert max_diff(m3, ref) <= TOL, max_diff(m3, ref)
    finally:
        zero_module._OFFLOAD_CPU_PARAMETERS = False
    try:
        hvd.ZeroRedundancyOptimizer(mz.parameters(), optimizer_class=torch.optim.Adam, offload_optimizer="nvme")
    except ValueError as exc:
        assert "offload_optimizer must be None, 'cpu'" in str(exc) and "NVMe" in str(exc), exc
    else:
        raise AssertionError("offload_optimizer='nvme' was accepted")


@case
def bad_input_is_refused_and_the_library_goes_on() -> None:
    m = Net()
    for kwargs, kind in (({"process_group": object()}, ValueError),
                         ({"overlap_with_ddp": True}, ValueError),
                         ({"op": hvd.Max}, ValueError),
                         ({"bucket_cap_mb": 0}, ValueError),
                         ({"backward_passes_per_step": 0}, ValueError),
                         ({"stage": 4}, ValueError),
                         ({"stage": 3}, ValueError),             # without model=
                         ({"model": m}, ValueError),             # model= at stage 1
                         ({"offload_optimizer": "gpu"}, ValueError),
                         ({"offload_optimizer": {"device": "cpu", "buffer_count": 4}}, ValueError),
                         ({"bucket_cap_mb": 1, "reduce_bucket_size": 1000}, ValueError),
                         ({"allgather_bucket_size": 0.5}, ValueError)):
        try:
            hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.SGD, lr=0.1, **kwargs)
        except kind:
            pass
        else:
            raise AssertionError(f"{kwargs} was accepted")
    try:
        hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class="adam", lr=0.1)
    except TypeError:
        pass
    else:
        raise AssertionError("a string optimizer_class was accepted")
    try:
        hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.LBFGS, lr=0.1)
    except ValueError as exc:
        assert "LBFGS" in str(exc) and "whole parameters" in str(exc), exc
    else:
        raise AssertionError("LBFGS, which needs whole parameters, was accepted")
    # Two backward passes before step(): refused at the second, on every rank alike.
    oz = hvd.ZeroRedundancyOptimizer(m.parameters(), optimizer_class=torch.optim.SGD, lr=0.1,
                                     bucket_cap_mb=0.004)   # c.weight alone fills a bucket
    x, y = batches(1)[0]
    F.cross_entropy(m(x), y).backward()
    try:
        F.cross_entropy(m(x), y).backward()
    except RuntimeError as exc:
        assert "before step()" in str(exc) and "backward_passes_per_step=1" in str(exc), exc
    else:
        raise AssertionError("a second backward pass before step() was accepted")
    oz.step()      # the buckets already in flight finish; the library goes on
    oz.zero_grad()
    F.cross_entropy(m(x), y).backward()
    oz.step()
    s = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="zero.after_errors")
    assert torch.equal(s, torch.full((3,), float(hvd.size())))


if __name__ == "__main__":
    run_cases()
