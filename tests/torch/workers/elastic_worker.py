"""hvd.elastic on a fixed world: run, TorchState, ElasticSampler.

Training through ``@hvd.elastic.run`` with an ``ElasticSampler`` is compared with plain
single-process PyTorch on the global batches (float64), the global batch of a step being
every rank's batch of that step: rank r's share of an epoch is every size()-th index of
the epoch's order, starting at r, and that order is range(len) shuffled by
random.Random(seed + epoch), as documented.
"""
from __future__ import annotations

import random

import torch
import torch.nn as nn
import torch.nn.functional as F

import hvdlite.torch as hvd
from _wcommon import case, run_cases

SAMPLES, BATCH, SEED = 24, 3, 11  # 24 divides evenly over 1-4 ranks


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1)).double()


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(5)
    return torch.utils.data.TensorDataset(torch.randn(SAMPLES, 4, generator=g, dtype=torch.float64),
                                          torch.randn(SAMPLES, 1, generator=g, dtype=torch.float64))


def epoch_order(epoch: int) -> list[int]:
    order = list(range(SAMPLES))
    random.Random(SEED + epoch).shuffle(order)
    return order


@case
def run_syncs_rank0_state_then_trains_like_global_batch() -> None:
    n, r = hvd.size(), hvd.rank()
    data = dataset()
    model = make_model(seed=100 + r)  # different on every rank until run() syncs them
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=SEED)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=r + 7, batch=0)
    state.epoch = 0 if r == 0 else 50  # rank 0's value wins at sync
    state.commit()
    processed_per_epoch = []

    @hvd.elastic.run
    def train(state, epochs):
        assert state.epoch == 0, f"epoch after sync: {state.epoch}"
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=state.sampler)
        for state.epoch in range(state.epoch, epochs):
            for idx, (x, y) in enumerate(loader):
                state.optimizer.zero_grad()
                F.mse_loss(state.model(x), y).backward()
                state.optimizer.step()
                state.sampler.record_batch(idx, BATCH)
                state.batch = idx + 1
                if idx % 2 == 1:
                    state.commit()
            processed_per_epoch.append(hvd.allgather_object(sorted(state.sampler.processed_indices)))
            state.batch = 0
            state.sampler.set_epoch(state.epoch + 1)
        return "done"

    assert train(state, 2) == "done"
    # Every sample processed exactly once per epoch, over all ranks.
    for epoch, per_rank in enumerate(processed_per_epoch):
        flat = [i for part in per_rank for i in part]
        assert sorted(flat) == list(range(SAMPLES)), f"epoch {epoch}: processed {sorted(flat)}"
    # Single process on the global batches, from rank 0's initial weights.
    ref = make_model(seed=100)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    x_all, y_all = data.tensors
    for epoch in range(2):
        shares = [epoch_order(epoch)[k::n] for k in range(n)]
        for t in range(-(-(SAMPLES // n) // BATCH)):  # the last batch may be short
            idx = [i for share in shares for i in share[t * BATCH:(t + 1) * BATCH]]
            ref_opt.zero_grad()
            F.mse_loss(ref(x_all[idx]), y_all[idx]).backward()
            ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-10, atol=1e-12), f"{name} differs from the global batch"
        everyone = hvd.allgather(p.detach().reshape(1, -1))
        assert torch.equal(everyone, p.detach().reshape(1, -1).expand(n, -1)), f"{name} differs by rank"
    assert state.epoch == 1 and state.sampler.epoch == 2, (state.epoch, state.sampler.epoch)


@case
def commit_and_restore_return_to_the_committed_state() -> None:
    model = make_model(seed=3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = hvd.elastic.TorchState(model, opt, scheduler=sched, epoch=1, note="a")
    x = torch.ones(2, 4, dtype=torch.float64)

    def step():
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        sched.step()

    step()
    state.commit()
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    kept_moment = opt.state_dict()["state"][0]["exp_avg"].clone()
    kept_lr = opt.param_groups[0]["lr"]
    step()
    step()
    state.epoch, state.note = 9, "b"
    assert not torch.equal(model.state_dict()["0.weight"], kept["0.weight"])
    state.restore()
    for k, v in model.state_dict().items():
        assert torch.equal(v, kept[k]), f"model {k} not restored"
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], kept_moment), "Adam moment not restored"
    assert sched.state_dict()["last_epoch"] == 1 and opt.param_groups[0]["lr"] == kept_lr, \
        (sched.state_dict(), opt.param_groups[0]["lr"])
    assert (state.epoch, state.note) == (1, "a"), (state.epoch, state.note)
    # Steps after a restore do not change the commit: a second failure before the next
    # commit goes back to the same state (the optimizer's load_state_dict keeps the
    # tensors it is given).
    step()
    state.restore()
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], kept_moment), "the commit changed after a restore"
    for k, v in model.state_dict().items():
        assert torch.equal(v, kept[k]), f"model {k} not restored the second time"
    # A new model assigned to the state becomes what restore() returns to.
    other = make_model(seed=4)
    state.model = other
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    state.restore()
    for k, v in other.state_dict().items():
        assert torch.equal(v, make_model(seed=4).state_dict()[k]), f"new model {k} not restored"


@case
def restored_sampler_skips_what_any_rank_processed() -> None:
    n = hvd.size()
    items = list(range(20))
    sampler = hvd.elastic.ElasticSampler(items, shuffle=False)
    state = hvd.elastic.TorchState(sampler=sampler, batch=0)
    share = list(iter(sampler))
    exact = items[hvd.rank()::n]
    # Batch size not known yet: a shorter share is padded with one of its own samples.
    padded = exact + ([exact[0]] if len(exact) < -(-20 // n) else [])
    assert share == padded, f"rank {hvd.rank()}'s share {share}"
    for b in range(2):
        sampler.record_batch(b, 2)
    # Now it is: padding stays only where the others have a batch more (q % 2 == 0).
    needs_pad = 20 % n and (20 // n) % 2 == 0 and hvd.rank() >= 20 % n
    assert list(iter(sampler)) == exact + ([exact[0]] if needs_pad else []), list(iter(sampler))
    share = exact
    state.commit()  # the union of every rank's processed samples
    sampler.record_batch(2, 2)  # not committed: forgotten by restore()
    state.restore()
    done = set(sampler.processed_indices)
    committed = set().union(*hvd.allgather_object(set(share[:4])))
    assert done == committed, f"restored processed {sorted(done)} != committed {sorted(committed)}"
    rest = list(iter(sampler))
    assert not set(rest) & committed, f"rank {hvd.rank()} would repeat {sorted(set(rest) & committed)}"
    everyone = set().union(*hvd.allgather_object(set(rest)))
    assert everyone | committed == set(items), "some samples would never be seen"
    # This rank's real samples are exactly its share of what is left (padding aside).
    assert sampler.get_indices(0, len(rest)) == sampler.remaining_indices[hvd.rank()::n], rest
    assert len(sampler) == len(rest)


@case
def uneven_shares_train_each_sample_once() -> None:
    """Shares that differ by one sample across a batch boundary: the shorter ranks get a
    padding batch, so every rank runs the same steps, and that batch weighs nothing --
    each step's update is the average gradient of the ranks that had real samples."""
    n, r = hvd.size(), hvd.rank()
    batch = 2
    for total in (n * batch * 2 + 1, n * 3 + 1):  # a padding batch needed; not needed
        x = torch.arange(1.0, total + 1, dtype=torch.float64).unsqueeze(1)
        data = torch.utils.data.TensorDataset(x)
        w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0),
                                       named_parameters=[(f"uneven.w{total}", w)])
        sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
        loader = torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler)
        steps = 0
        for idx, (xb,) in enumerate(loader):
            before = w.detach().clone()
            opt.zero_grad()
            (w * xb).sum().backward()  # gradient: the sum of the batch's values
            opt.step()
            sampler.record_batch(idx, batch)
            # Every rank's real samples of this step, and the expected averaged update.
            real = hvd.allgather_object(sampler.get_indices(idx, batch))
            with_data = [sum(i + 1.0 for i in part) for part in real if part]
            expected = before - sum(with_data) / len(with_data)
            assert torch.allclose(w.detach(), expected), (total, idx, w, expected, real)
            steps += 1
        assert len(set(hvd.allgather_object(steps))) == 1, "ranks ran different numbers of steps"
        done = hvd.allgather_object(sorted(sampler.processed_indices))
        flat = [i for part in done for i in part]
        assert sorted(flat) == list(range(total)), f"{total}: processed {sorted(flat)}"
        if total == n * batch * 2 + 1 and n > 1:
            assert steps == 3 and (len(sampler) == 2 * batch + 1), (steps, len(sampler))


@case
def errors_propagate_without_retry() -> None:
    calls = []
    state = hvd.elastic.ObjectState(bcast_object=lambda o: hvd.broadcast_object(o, root_rank=0),
                                    get_rank=hvd.rank, step=hvd.rank())

    @hvd.elastic.run
    def fails(state):
        calls.append(state.step)
        raise hvd.HorovodInternalError("a collective failed")

    try:
        fails(state)
    except hvd.HorovodInternalError as e:
        assert "a collective failed" in str(e)
    else:
        raise AssertionError("the error was swallowed")
    assert calls == [0], f"called {calls} (rank 0's step once, no retry)"
    if hvd.size() > 1:
        @hvd.elastic.run
        def mismatched(state):
            return hvd.allreduce(torch.zeros(2 + hvd.rank()), name="elastic.mismatch")

        try:
            mismatched(state)
        except hvd.HorovodInternalError as e:
            assert "elastic.mismatch" in str(e), str(e)
        else:
            raise AssertionError("ranks disagreeing on a shape did not raise")
    got = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="elastic.after")
    assert torch.equal(got, torch.full((3,), float(hvd.size()))), got


if __name__ == "__main__":
    run_cases()
