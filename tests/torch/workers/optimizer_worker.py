"""DistributedOptimizer against single-process training on the global batch.

Each rank trains its replica with ``hvd.DistributedOptimizer`` on its own share of
every global batch, and -- in the same process, without hvdlite -- a reference replica
with the plain optimizer on the whole global batch (every rank can build every rank's
data). After k steps the distributed parameters must equal the reference ones (float64,
so up to rounding) and be bit-identical across ranks.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd
from _wcommon import case, run_cases

torch.set_default_dtype(torch.float64)
B = 4  # local batch


class Net(nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 3)
        self.extra = nn.Linear(16, 3)   # used only on some ranks in some steps
        self.unused = nn.Linear(16, 3)  # never used: its gradient stays None

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        h = torch.tanh(self.fc1(self.frozen(x)))
        h = torch.tanh(self.fc2(h))
        out = self.fc3(h)
        if use_extra:
            out = out + self.extra(h)
        return out


def batch(step: int, k: int, n: int = B, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(7919 * step + k)
    return torch.randn(n, 6, generator=g).to(dtype), torch.randn(n, 3, generator=g).to(dtype)


def never(step: int, k: int) -> bool:
    return False


def global_batch_loss(ref: nn.Module, step: int, n: int) -> torch.Tensor:
    """The single-process reference's loss on the union of the n ranks' batches."""
    return sum(F.mse_loss(ref(batch(step, k)[0]), batch(step, k)[1]) for k in range(n)) / n


def reference_step(ref: nn.Module, ref_opt: Any, step: int, n: int) -> None:
    """One step of the single-process reference on the global batch."""
    ref_opt.zero_grad()
    global_batch_loss(ref, step, n).backward()
    ref_opt.step()


def loss_closure(opt: Any, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
    """An ``optimizer.step(closure)`` closure: clear, compute this rank's loss, backward."""
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss
    return closure


def make_replicas(dtype: torch.dtype = torch.float64) -> tuple[Net, Net]:
    """The distributed replica starts from a rank-dependent init and is synchronised by
    broadcast_parameters; the reference starts from rank 0's init."""
    model = Net(seed=100 + hvd.rank()).to(dtype)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ref = Net(seed=100).to(dtype)
    return model, ref


def check_params(model: nn.Module, ref: nn.Module, what: str, rtol: float = 1e-9,
                 atol: float = 1e-11) -> None:
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        if not torch.allclose(p.detach(), q.detach().to(p.dtype), rtol=rtol, atol=atol):
            diff = (p.detach() - q.detach().to(p.dtype)).abs().max().item()
            raise AssertionError(f"{what}: parameter {name} differs from single-process "
                                 f"training by {diff:.3g}")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0))
    for k in range(every.shape[0]):
        if not torch.equal(every[k], flat):
            raise AssertionError(f"{what}: parameters on rank {k} differ from rank {hvd.rank()}")


def train(make_opt: Callable[[nn.Module], torch.optim.Optimizer], wrap: Callable, steps: int = 4,
          use_extra: Callable[[int, int], bool] = never, dtype: torch.dtype = torch.float64,
          loss_scale: float = 1.0, what: str = "", rtol: float = 1e-9, atol: float = 1e-11,
          op_sum: bool = False) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    r, n = hvd.rank(), hvd.size()
    model, ref = make_replicas(dtype)
    opt = wrap(make_opt(model), model)
    ref_opt = make_opt(ref)
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step, r, dtype=dtype)
        (F.mse_loss(model(x, use_extra(step, r)), y) * loss_scale).backward()
        opt.step()

        ref_opt.zero_grad()
        losses = [F.mse_loss(ref(*[batch(step, k, dtype=dtype)[0]], use_extra(step, k)),
                             batch(step, k, dtype=dtype)[1]) for k in range(n)]
        total = sum(losses) if op_sum else sum(losses) / n
        (total * loss_scale).backward()
        ref_opt.step()
    check_params(model, ref, what, rtol, atol)
    return model, ref, opt


def dist(**kw):
    def wrap(opt: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **kw)
    return wrap


def sgd(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1, momentum=0.9,
                           weight_decay=1e-3)


def adam(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=0.01)


def adamw(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=0.01,
                             weight_decay=0.05)


@case
def sgd_momentum_matches_global_batch() -> None:
    model, ref, opt = train(sgd, dist(), steps=5, what="SGD+momentum")
    assert isinstance(opt, torch.optim.SGD)
    assert model.unused.weight.grad is None, "a parameter no rank used must keep grad None"


@case
def sgd_concatenated_batch_literally() -> None:
    # The reference trains on torch.cat of all ranks' batches (mean loss over it).
    r, n = hvd.rank(), hvd.size()
    model, ref = make_replicas()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    ref_opt = sgd(ref)
    for step in range(3):
        opt.zero_grad()
        x, y = batch(step, r)
        F.mse_loss(model(x), y).backward()
        opt.step()
        ref_opt.zero_grad()
        xs, ys = zip(*[batch(step, k) for k in range(n)])
        F.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        ref_opt.step()
    check_params(model, ref, "SGD on the concatenated batch")


@case
def adam_matches_global_batch() -> None:
    train(adam, dist(), steps=5, what="Adam")


@case
def adamw_groups_match_global_batch() -> None:
    train(adamw, dist(groups=2), steps=4, what="AdamW groups=2")


@case
def explicit_groups_and_unnamed() -> None:
    def wrap(opt: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        groups = [[model.fc1.weight, model.fc1.bias, model.fc2.weight], [model.fc3.weight, model.fc3.bias]]
        return hvd.DistributedOptimizer(opt, groups=groups)
    train(sgd, wrap, steps=3, what="explicit groups, no names")


@case
def sum_op_and_predivide() -> None:
    train(sgd, dist(op=hvd.Sum), steps=3, what="op=Sum", op_sum=True)
    train(sgd, dist(gradient_predivide_factor=2.0), steps=3, what="gradient_predivide_factor")


@case
def backward_passes_per_step_equals_4x_batch() -> None:
    r, n = hvd.rank(), hvd.size()
    for make_opt in (sgd, adam):
        model, ref = make_replicas()
        opt = hvd.DistributedOptimizer(make_opt(model), named_parameters=model.named_parameters(),
                                       backward_passes_per_step=4)
        ref_opt = make_opt(ref)
        for step in range(3):
            opt.zero_grad()
            for micro in range(4):
                x, y = batch(100 + 4 * step + micro, r)
                (F.mse_loss(model(x), y) / 4).backward()
            opt.step()
            ref_opt.zero_grad()
            xs, ys = zip(*[batch(100 + 4 * step + m, k) for k in range(n) for m in range(4)])
            F.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()  # one step on 4x the batch
            ref_opt.step()
        check_params(model, ref, f"backward_passes_per_step=4 ({make_opt.__name__})")
    # A fifth backward pass before step() is an error.
    model, _ = make_replicas()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    for micro in range(2):
        x, y = batch(micro, r)
        F.mse_loss(model(x), y).backward()
    x, y = batch(9, r)
    try:
        F.mse_loss(model(x), y).backward()
    except RuntimeError as e:
        assert "backward_passes_per_step" in str(e), str(e)
    else:
        if hvd.size() > 1:
            raise AssertionError("a backward pass too many must raise")
    opt.step()


@case
def compression_fp16_bf16() -> None:
    for comp in (hvd.Compression.fp16, hvd.Compression.bf16):
        train(sgd, dist(compression=comp), steps=3, dtype=torch.float32,
              what=f"compression {comp.__name__}", rtol=2e-2, atol=5e-3)


@case
def unused_parameters_on_some_ranks() -> None:
    # 'extra' is used by rank 0 on even steps only; the other ranks contribute zeros.
    train(sgd, dist(), steps=4, use_extra=lambda s, k: k == 0 and s % 2 == 0,
          what="parameters used on some ranks only")
    train(adam, dist(groups=3), steps=4, use_extra=lambda s, k: k == hvd.size() - 1 and s >= 2,
          what="partially used parameters in groups")


def as_in_an_elastic_job(**kw):
    """dist(), built as in an elastic job: its hooks stay at every size, one rank alone
    included (then no rank is there to be told which gradients this one has)."""
    plain = dist(**kw)

    def wrap(opt: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        os.environ["HVDLITE_ELASTIC"] = "1"
        try:
            return plain(opt, model)
        finally:
            del os.environ["HVDLITE_ELASTIC"]
    return wrap


@case
def hooked_at_every_size_with_unused_parameters() -> None:
    for cap in (None, 25):
        model, _, opt = train(sgd, as_in_an_elastic_job(bucket_cap_mb=cap), steps=4,
                              use_extra=lambda s, k: k == 0 and s % 2 == 0,
                              what=f"hooked at every size, bucket_cap_mb={cap}")
        assert opt._hvd_active, "the optimizer of an elastic job keeps its hooks"
        assert model.unused.weight.grad is None, "a parameter no rank used keeps grad None"
        # The last step (odd) used 'extra' nowhere: its gradient was cleared and stays None.
        assert model.extra.weight.grad is None, "a parameter unused in this step keeps grad None"


@case
def synchronize_clip_skip_synchronize() -> None:
    r, n = hvd.rank(), hvd.size()
    model, ref = make_replicas()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    ref_opt = sgd(ref)
    for step in range(3):
        opt.zero_grad()
        x, y = batch(step, r)
        F.mse_loss(model(x), y).backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        with opt.skip_synchronize():
            opt.step()
        ref_opt.zero_grad()
        global_batch_loss(ref, step, n).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        ref_opt.step()
    check_params(model, ref, "synchronize + clip + skip_synchronize")
    # step() right after synchronize() outside skip_synchronize warns (and still works).
    opt.zero_grad()
    x, y = batch(50, r)
    F.mse_loss(model(x), y).backward()
    opt.synchronize()
    if n > 1:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        assert any("skip_synchronize" in str(w.message) for w in caught)
    else:
        opt.step()


@case
def zero_grad_while_in_flight_is_an_error() -> None:
    r, n = hvd.rank(), hvd.size()
    model, _ = make_replicas()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    x, y = batch(0, r)
    F.mse_loss(model(x), y).backward()
    for kwargs in ({}, {"set_to_none": False}, {"set_to_none": True}):
        try:
            opt.zero_grad(**kwargs)
        except AssertionError as e:  # Horovod's type; hvdlite's is also a RuntimeError
            assert isinstance(e, RuntimeError), type(e)
            assert "zero_grad" in str(e) and "step()" in str(e), str(e)
        else:
            if n > 1:
                raise AssertionError(f"zero_grad({kwargs}) with allreduces in flight must raise")
    opt.step()
    opt.zero_grad(set_to_none=False)  # fine after step()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


@case
def model_zero_grad_while_in_flight_is_an_error() -> None:
    # model.zero_grad() (grad -> None) or replacing a gradient while its allreduce is in
    # flight gives the same clear error as optimizer.zero_grad(); training then goes on.
    r, n = hvd.rank(), hvd.size()
    model, ref = make_replicas()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    ref_opt = sgd(ref)
    clears = {"model.zero_grad()": lambda: model.zero_grad(),
              "a replaced .grad": lambda: setattr(model.fc1.weight, "grad",
                                                  torch.zeros_like(model.fc1.weight))}
    for what, clear in clears.items():
        opt.zero_grad()
        x, y = batch(0, r)
        F.mse_loss(model(x), y).backward()
        clear()
        try:
            opt.step()
        except RuntimeError as e:
            assert "zero_grad" in str(e) and "step()" in str(e), str(e)
        else:
            if n > 1:
                raise AssertionError(f"step() after {what} with allreduces in flight must "
                                     f"raise RuntimeError")
    if n == 1:
        return  # nothing was in flight: those steps were taken, unlike the reference's
    for step in range(2):
        opt.zero_grad()
        x, y = batch(step, r)
        F.mse_loss(model(x), y).backward()
        opt.step()
        reference_step(ref, ref_opt, step, n)
    check_params(model, ref, "training after the failed steps")


@case
def step_with_closure_averages_gradients() -> None:
    r, n = hvd.rank(), hvd.size()
    model, ref = make_replicas()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    ref_opt = sgd(ref)
    for step in range(3):
        x, y = batch(step, r)
        closure = loss_closure(opt, model, x, y)
        with torch.no_grad():
            want = F.mse_loss(model(x), y)
            # The closure still gets gradients under no_grad, as in plain PyTorch.
            loss = opt.step(closure)
        assert isinstance(loss, torch.Tensor) and torch.equal(loss.detach(), want), \
            "step(closure) returns the closure's loss"
        reference_step(ref, ref_opt, step, n)
    check_params(model, ref, "step(closure)")


@case
def lbfgs_closure_is_averaged_every_evaluation() -> None:
    # LBFGS evaluates the closure several times per step: each evaluation's gradients
    # must be averaged, or the ranks' line searches (and parameters) drift apart.
    r, n = hvd.rank(), hvd.size()
    model, ref = make_replicas()
    opt = hvd.DistributedOptimizer(torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4),
                                   named_parameters=model.named_parameters())
    ref_opt = torch.optim.LBFGS(ref.parameters(), lr=0.5, max_iter=4)
    for step in range(2):
        opt.step(loss_closure(opt, model, *batch(step, r)))

        def ref_closure() -> torch.Tensor:
            ref_opt.zero_grad()
            loss = global_batch_loss(ref, step, n)
            loss.backward()
            return loss
        ref_opt.step(ref_closure)
    check_params(model, ref, "LBFGS step(closure)")


@case
def two_unnamed_optimizers_one_loss() -> None:
    # Two models, each with its own DistributedOptimizer built without names, trained on
    # one loss: both optimizers' gradients are in flight together.
    r, n = hvd.rank(), hvd.size()
    models, refs = zip(*[make_replicas() for _ in range(2)])
    opts = [hvd.DistributedOptimizer(sgd(m)) for m in models]
    ref_opts = [sgd(m) for m in refs]
    for step in range(3):
        for o in opts:
            o.zero_grad()
        x, y = batch(step, r)
        F.mse_loss(models[0](x) + models[1](x), y).backward()
        for o in opts:
            o.step()
        for o in ref_opts:
            o.zero_grad()
        (sum(F.mse_loss(refs[0](batch(step, k)[0]) + refs[1](batch(step, k)[0]), batch(step, k)[1])
             for k in range(n)) / n).backward()
        for o in ref_opts:
            o.step()
    for m, q in zip(models, refs):
        check_params(m, q, "two unnamed optimizers on one loss")


@case
def frozen_then_unfrozen_and_added_group() -> None:
    r, n = hvd.rank(), hvd.size()
    model, ref = make_replicas()
    base = [model.fc1, model.fc2, model.fc3]
    rbase = [ref.fc1, ref.fc2, ref.fc3]
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([p for m in base for p in m.parameters()], lr=0.1, momentum=0.9))
    ref_opt = torch.optim.SGD([p for m in rbase for p in m.parameters()], lr=0.1, momentum=0.9)
    use = lambda s, k: s >= 2  # noqa: E731 - 'extra' joins the model at step 2
    for step in range(5):
        if step == 2:  # a parameter group added later
            opt.add_param_group({"params": list(model.extra.parameters()), "lr": 0.05})
            ref_opt.add_param_group({"params": list(ref.extra.parameters()), "lr": 0.05})
        if step == 3:  # a frozen layer is unfrozen and added
            for m in (model, ref):
                m.frozen.requires_grad_(True)
            opt.add_param_group({"params": list(model.frozen.parameters()), "lr": 0.02})
            ref_opt.add_param_group({"params": list(ref.frozen.parameters()), "lr": 0.02})
        if step == 4:  # and fc1 is frozen again
            for m in (model, ref):
                m.fc1.requires_grad_(False)
        opt.zero_grad()
        x, y = batch(step, r)
        F.mse_loss(model(x, use(step, r)), y).backward()
        opt.step()
        ref_opt.zero_grad()
        (sum(F.mse_loss(ref(batch(step, k)[0], use(step, k)), batch(step, k)[1])
             for k in range(n)) / n).backward()
        ref_opt.step()
    check_params(model, ref, "frozen layers, unfreezing, added parameter groups")


@case
def lr_scheduler_and_state_dict() -> None:
    r, n = hvd.rank(), hvd.size()
    model, ref = make_replicas()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    ref_opt = sgd(ref)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    for step in range(3):
        opt.zero_grad()
        x, y = batch(step, r)
        F.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
        reference_step(ref, ref_opt, step, n)
        ref_sched.step()
    assert abs(opt.param_groups[0]["lr"] - 0.1 * 0.5 ** 3) < 1e-12
    check_params(model, ref, "with an LR scheduler")
    sd = opt.state_dict()
    opt.load_state_dict(sd)
    opt.zero_grad()
    x, y = batch(9, r)
    F.mse_loss(model(x), y).backward()
    opt.step()


@case
def sparse_embedding_gradients() -> None:
    r, n = hvd.rank(), hvd.size()
    for sparse_as_dense in (False, True):
        torch.manual_seed(5 + r)
        emb = nn.Embedding(20, 4, sparse=True)
        hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
        torch.manual_seed(5)
        ref = nn.Embedding(20, 4, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.5),
                                       named_parameters=emb.named_parameters(),
                                       sparse_as_dense=sparse_as_dense)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)

        def ids(step: int, k: int) -> torch.Tensor:
            return torch.tensor([(3 * step + 5 * k + i) % 20 for i in range(3)])

        for step in range(3):
            opt.zero_grad()
            (emb(ids(step, r)) ** 2).sum().backward()
            opt.step()
            ref_opt.zero_grad()
            (sum((ref(ids(step, k)) ** 2).sum() for k in range(n)) / n).backward()
            ref_opt.step()
        assert torch.allclose(emb.weight, ref.weight, atol=1e-12), \
            f"sparse embedding (sparse_as_dense={sparse_as_dense})"


@case
def torch_compile_matches_global_batch() -> None:
    # A torch.compile'd model (AOTAutograd, on which inductor also builds; aot_eager
    # needs no C++ compiler) still fires the per-parameter gradient hooks.
    r, n = hvd.rank(), hvd.size()
    model, ref = make_replicas()
    compiled = torch.compile(model, backend="aot_eager")
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    ref_opt = sgd(ref)
    for step in range(3):
        opt.zero_grad()
        x, y = batch(step, r)
        F.mse_loss(compiled(x), y).backward()
        opt.step()
        reference_step(ref, ref_opt, step, n)
    check_params(model, ref, "torch.compile (aot_eager)")


class ReversedNet(nn.Module):
    """Layers registered in the reverse of the order they run: the gradients arrive in
    the order of the parameters, not their reverse, so the buckets are laid out again."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.out = nn.Linear(16, 3)
        self.mid = nn.Linear(16, 16)
        self.inp = nn.Linear(6, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mid(torch.tanh(self.inp(x)))))


class PlainNet(ReversedNet):
    """ReversedNet's layers, registered in the order they run."""

    def __init__(self, seed: int) -> None:
        nn.Module.__init__(self)
        torch.manual_seed(seed)
        self.inp = nn.Linear(6, 16)
        self.mid = nn.Linear(16, 16)
        self.out = nn.Linear(16, 3)


def params_after(net: type, bucket_cap_mb: Any, passes: int, steps: int = 4,
                 use_extra: Callable[[int, int], bool] = never) -> tuple[torch.Tensor, Any]:
    r = hvd.rank()
    model = net(0)
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, bucket_cap_mb=bucket_cap_mb)
    for step in range(steps):
        opt.zero_grad(set_to_none=step % 2 == 0)  # both ways of clearing the bucket views
        for micro in range(passes):
            x, y = batch(10 * step + micro, r)
            out = model(x, use_extra(step, r)) if net is Net else model(x)
            (F.mse_loss(out, y) / passes).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), opt


@case
def buckets_equal_per_tensor() -> None:
    # Several buckets (a 1 KiB cap), one bucket (the default), and a bucket per tensor
    # (bucket_cap_mb=None: Horovod's way): the same parameters to 1e-12, with and
    # without backward_passes_per_step, with parameters some ranks do not use.
    sometimes = lambda s, k: k == 0 and s % 2 == 1  # noqa: E731
    for net, extra in ((Net, never), (Net, sometimes), (ReversedNet, never), (PlainNet, never)):
        for passes in (1, 3):
            want, _ = params_after(net, None, passes, use_extra=extra)
            for cap in (1 / 1024, 25):
                got, opt = params_after(net, cap, passes, use_extra=extra)
                diff = (got - want).abs().max().item()
                assert diff <= 1e-12, f"{net.__name__} cap={cap} passes={passes}: differs by {diff:.3g}"
                if hvd.size() == 1:
                    assert opt._hvd_buckets is None  # one rank reduces nothing
                    continue
                layout = opt._hvd_buckets
                sizes = [len(b.params) for b in layout.buckets]
                # At 25 MiB one bucket, and one more for Net's parameters that got no
                # gradient in the first step; at 1 KiB each of the larger weights alone.
                assert len(sizes) == (2 if net is Net else 1) if cap > 1 else len(sizes) >= 3, (cap, sizes)
                # The first step's reverse order is kept when the gradients arrive in it
                # (PlainNet). ReversedNet's arrive the other way, and Net's first two
                # parameters in reverse order get no gradient in the first step (they go
                # to buckets of their own at the end): both get a second layout.
                assert layout.generation == (1 if net is PlainNet else 2), (net, layout.generation)
                used = [p for p in opt._hvd_managed() if p.grad is not None]
                assert len(used) >= 6, len(used)
                for p in used:
                    b = layout.bucket_of.get(p)
                    assert b is not None, "every dense gradient is in a bucket"
                    flat = b.flat
                    start = flat.data_ptr()
                    assert start <= p.grad.data_ptr() < start + flat.numel() * flat.element_size(), \
                        "the gradient is a view into its bucket"
    model, _ = make_replicas()
    opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    F.mse_loss(model(batch(0, hvd.rank())[0]), batch(0, hvd.rank())[1]).backward()
    opt.step()
    assert model.unused.weight.grad is None, "a parameter no rank used keeps grad None"


def expect_on_every_rank(what: str, fn: Callable[[], Any], *needles: str) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the type is checked by the caller's needles
        text = f"{type(exc).__name__}: {exc}"
    else:
        raise AssertionError(f"{what}: no error on rank {hvd.rank()}")
    for needle in needles:
        assert needle in text, f"{what}: {needle!r} not in {text!r}"
    return text


@case
def bucket_bad_input_fails_on_every_rank() -> None:
    r, n = hvd.rank(), hvd.size()
    last = n - 1
    model, _ = make_replicas()
    # A bucket size of 0 (here on the last rank only; on one rank, the rank alone).
    for bad in (0, -1.0, "big"):
        expect_on_every_rank(
            f"bucket_cap_mb={bad!r}",
            lambda: hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                             bucket_cap_mb=bad if r == last else 25),
            "ValueError", "bucket_cap_mb must be a positive number", f"rank(s) {last}" if n > 1 else "got")
    if n > 1:
        # Ranks that would lay out different buckets.
        expect_on_every_rank(
            "different caps",
            lambda: hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                             bucket_cap_mb=None if r == last else 25),
            "ValueError", "different gradient buckets")
        # A parameter that changes shape after the optimizer was built (on the last rank):
        # that rank refuses the bucket, so step() fails on every rank, naming it.
        opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
        x, y = batch(0, r)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if r == last:
            with torch.no_grad():
                model.fc3.bias.data = torch.zeros(1)  # still broadcasts in forward
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        expect_on_every_rank("a parameter that changed shape", opt.step,
                             f"rank {last}", "fc3.bias", "changed shape")
    # The library is still usable: a fresh model trains and agrees across ranks.
    train(sgd, dist(), steps=2, what="after the bad input")


@case
def wrong_arguments_raise() -> None:
    model, _ = make_replicas()
    for kwargs, exc in [({"named_parameters": [("a", model.fc1.weight)]}, ValueError),
                        ({"named_parameters": [("a", p) for p in model.parameters()]}, ValueError),
                        ({"op": hvd.Max}, ValueError),
                        ({"backward_passes_per_step": 0}, ValueError)]:
        try:
            hvd.DistributedOptimizer(sgd(model), **kwargs)
        except exc:
            pass
        else:
            raise AssertionError(f"DistributedOptimizer({kwargs}) must raise {exc.__name__}")


if __name__ == "__main__":
    run_cases()
