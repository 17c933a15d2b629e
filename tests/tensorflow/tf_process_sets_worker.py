"""Process sets in the TensorFlow front end, on 3 ranks: sets [0, 2] and [1] registered
at init, and a dynamic one. Every collective kind runs on a set eagerly, in tf.function
and in a TF1 Session graph, checked against NumPy over the set's members; the tape and
the Keras optimizer average over their set only; errors for a rank outside the set.
Prints ``PASS <case> rank <r>``."""
from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402
from tf_cases import case, run_cases  # noqa: E402

EVEN, ODD = hvd.ProcessSet([0, 2]), hvd.ProcessSet([1])
def value(r: int, shape=(4,)) -> np.ndarray:
    return (np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 10 * r)


def mine():
    return EVEN if hvd.rank() in (0, 2) else ODD


def close(got, want, what):
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    assert np.allclose(got, want), f"{what}: got {got}, want {want}"


@case
def collectives_on_a_set() -> None:
    ps = mine()
    members = ps.ranks
    me = hvd.rank()
    assert ps.size() == len(members) and ps.rank() == members.index(me) and ps.included()
    for mode in ("eager", "function"):
        def run(fn):
            return fn() if mode == "eager" else tf.function(fn)()
        x = tf.constant(value(me))
        close(run(lambda: hvd.allreduce(x, op=hvd.Sum, process_set=ps, name=f"ps.sum.{mode}")),
              sum(value(r) for r in members), f"{mode} allreduce sum")
        close(run(lambda: hvd.allreduce(x, process_set=ps, name=f"ps.avg.{mode}")),
              np.mean([value(r) for r in members], 0), f"{mode} allreduce average")
        close(run(lambda: hvd.allgather(x, process_set=ps, name=f"ps.ag.{mode}")),
              np.concatenate([value(r) for r in members]), f"{mode} allgather")
        root = members[-1]  # a world rank
        close(run(lambda: hvd.broadcast(x, root_rank=root, process_set=ps, name=f"ps.bc.{mode}")),
              value(root), f"{mode} broadcast")
        grouped = run(lambda: hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, process_set=ps,
                                                    name=f"ps.grouped.{mode}"))
        close(grouped[1], 2 * sum(value(r) for r in members), f"{mode} grouped allreduce")
        rows = tf.constant(value(me, (2 * len(members), 2)))
        got = run(lambda: hvd.reducescatter(rows, op=hvd.Sum, process_set=ps, name=f"ps.rs.{mode}"))
        k = ps.rank()
        close(got, sum(value(r, (2 * len(members), 2)) for r in members)[2 * k:2 * k + 2],
              f"{mode} reducescatter")
        got = run(lambda: hvd.alltoall(rows, process_set=ps, name=f"ps.a2a.{mode}"))
        close(got, np.concatenate([value(r, (2 * len(members), 2))[2 * k:2 * k + 2] for r in members]),
              f"{mode} alltoall")
        # The global set in between: a set's collectives do not stand in its way.
        close(run(lambda: hvd.allreduce(x, op=hvd.Sum, name=f"ps.global.{mode}")),
              sum(value(r) for r in range(hvd.size())), f"{mode} global allreduce")
    close(hvd.size_op(process_set_id=ps.process_set_id), len(members), "size_op")
    close(hvd.process_set_included_op(process_set_id=EVEN.process_set_id), int(me in (0, 2)), "included_op")
    got = hvd.allgather_object({"rank": me}, process_set=ps)
    assert got == [{"rank": r} for r in members], got
    assert hvd.broadcast_object(me, root_rank=members[0], process_set=ps) == members[0]


@case
def gradients_on_a_set() -> None:
    ps, me = mine(), hvd.rank()
    members = ps.ranks
    c = tf.constant(value(me))
    v = tf.Variable(tf.zeros(4))

    def tape_grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * c)
        return hvd.DistributedGradientTape(tape, process_set=ps).gradient(loss, [v])[0]
    want = np.mean([value(r) for r in members], 0)
    close(tape_grad(), want, "eager tape")
    close(tf.function(tape_grad)(), want, "tf.function tape")
    # Differentiable collectives keep their set in the backward pass.
    x = tf.Variable(value(me))
    with tf.GradientTape() as tape:
        y = hvd.allgather(x, process_set=ps, name="ps.ag.grad")
        loss = tf.reduce_sum(y * y)
    g = tape.gradient(loss, x)
    # d/dx_me of sum over the gathered rows: 2 x_me, averaged over the set's ranks' gradients.
    close(g, 2 * value(me), "allgather gradient on a set")
    kv = keras.Variable(np.zeros(4, np.float32))
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), process_set=ps)
    opt.apply_gradients([(c, kv)])
    close(kv.numpy(), -want, "keras optimizer on a set")


def upstream(r: int, shape) -> np.ndarray:
    """The gradient rank ``r`` feeds back into a collective's output (distinct per rank)."""
    return np.cos(np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 3 * r).astype(np.float32)


def a2a_splits(members, i: int) -> list[int]:
    """Rows the member at set rank ``i`` sends to each member (uneven, some zero)."""
    return [(i + 2 * j) % 3 for j in range(len(members))]


def expected_gradients(ps) -> dict[str, np.ndarray]:
    """Each differentiable collective's input gradient on this rank, from the gradients
    every member feeds back (NumPy over the set's members, Horovod's rules): allreduce
    reduces the gradients with its op and scale factors; allgather averages the set's
    gradients of this rank's rows; broadcast gives the root their average and the
    others zeros; alltoall sends each gradient block back to where its rows came from;
    reducescatter gathers the blocks, times the set's size for Sum, times its scale
    factors."""
    members, me = ps.ranks, hvd.rank()
    n, k = len(members), members.index(me)
    want = {
        "allreduce_sum_scaled": 0.5 * 3.0 * sum(upstream(r, (4,)) for r in members),
        "allreduce_average": np.mean([upstream(r, (4,)) for r in members], 0),
        "grouped_allreduce": [sum(upstream(r, (4,)) for r in members),
                              sum(upstream(r + 7, (3,)) for r in members)],
        "broadcast": (np.mean([upstream(r, (4,)) for r in members], 0) if me == members[-1]
                      else np.zeros(4, np.float32)),
    }
    rows = [1 + (members.index(r) % 2) for r in members]  # allgather rows per member
    start = sum(rows[:k])
    gathered = (sum(rows), 2)
    want["allgather"] = np.mean([upstream(r, gathered)[start:start + rows[k]] for r in members], 0)
    want["grouped_allgather"] = [want["allgather"],
                                 np.mean([upstream(r + 5, (sum(rows),))[start:start + rows[k]]
                                          for r in members], 0)]
    splits = [a2a_splits(members, i) for i in range(n)]
    blocks = []
    for j, r in enumerate(members):  # what member j received, in sender order
        dy = upstream(r, (sum(splits[i][j] for i in range(n)), 2))
        off = sum(splits[i][j] for i in range(k))
        blocks.append(dy[off:off + splits[k][j]])
    want["alltoall"] = np.concatenate(blocks)
    block = [upstream(r, (2, 2)) for r in members]
    want["reducescatter_sum_scaled"] = np.concatenate(block) * n * 2.0 * 0.25
    want["reducescatter_average"] = np.concatenate(block)
    want["grouped_reducescatter"] = [np.concatenate(block) * n,
                                     np.concatenate([upstream(r + 9, (2,)) for r in members]) * n]
    return want


def gradients_of(ps, tag: str) -> dict[str, Any]:
    """The input gradients of every differentiable collective on set ``ps``, each fed
    this rank's ``upstream`` gradient (computed with a tape; in tf.function when the
    caller traces this)."""
    members, me = ps.ranks, hvd.rank()
    n, k = len(members), members.index(me)
    got: dict[str, Any] = {}

    def grad(name, build, xs, ups):
        xs = [tf.constant(x) for x in xs]
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            ys = build(*xs)
            ys = ys if isinstance(ys, (list, tuple)) else [ys]
        gs = tape.gradient(list(ys), xs, output_gradients=[tf.constant(u) for u in ups])
        got[name] = gs if len(gs) > 1 else gs[0]

    v4 = value(me)
    grad("allreduce_sum_scaled", lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                                         postscale_factor=3.0, process_set=ps,
                                                         name=f"g.ar.{tag}"),
         [v4], [upstream(me, (4,))])
    grad("allreduce_average", lambda x: hvd.allreduce(x, process_set=ps, name=f"g.avg.{tag}"),
         [v4], [upstream(me, (4,))])
    grad("grouped_allreduce", lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum, process_set=ps,
                                                                 name=f"g.gar.{tag}"),
         [v4, value(me, (3,))], [upstream(me, (4,)), upstream(me + 7, (3,))])
    grad("broadcast", lambda x: hvd.broadcast(x, root_rank=members[-1], process_set=ps,
                                              name=f"g.bc.{tag}"),
         [v4], [upstream(me, (4,))])
    rows = [1 + (i % 2) for i in range(n)]
    total = sum(rows)
    grad("allgather", lambda x: hvd.allgather(x, process_set=ps, name=f"g.ag.{tag}"),
         [value(me, (rows[k], 2))], [upstream(me, (total, 2))])
    grad("grouped_allgather", lambda a, b: hvd.grouped_allgather([a, b], process_set=ps,
                                                                 name=f"g.gag.{tag}"),
         [value(me, (rows[k], 2)), value(me, (rows[k],))],
         [upstream(me, (total, 2)), upstream(me + 5, (total,))])
    splits = [a2a_splits(members, i) for i in range(n)]
    received = sum(splits[i][k] for i in range(n))
    grad("alltoall", lambda x: hvd.alltoall(x, splits=splits[k], process_set=ps,
                                            name=f"g.a2a.{tag}")[0],
         [value(me, (sum(splits[k]), 2))], [upstream(me, (received, 2))])
    grad("reducescatter_sum_scaled",
         lambda x: hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25,
                                     process_set=ps, name=f"g.rs.{tag}"),
         [value(me, (2 * n, 2))], [upstream(me, (2, 2))])
    grad("reducescatter_average", lambda x: hvd.reducescatter(x, process_set=ps, name=f"g.rsa.{tag}"),
         [value(me, (2 * n, 2))], [upstream(me, (2, 2))])
    grad("grouped_reducescatter",
         lambda a, b: hvd.grouped_reducescatter([a, b], op=hvd.Sum, process_set=ps, name=f"g.grs.{tag}"),
         [value(me, (2 * n, 2)), value(me, (2 * n,))], [upstream(me, (2, 2)), upstream(me + 9, (2,))])
    return got


@case
def gradient_of_every_collective_stays_on_its_set() -> None:
    """Every differentiable collective's gradient runs on the set its forward ran on,
    with its op, scale factors and (for alltoall) the splits it received, eagerly and
    in tf.function; a global allreduce follows on every rank. (A gradient run on the
    global set instead fails or waits for ranks outside the set.)"""
    ps = mine()
    want = expected_gradients(ps)
    for mode in ("eager", "function"):
        got = gradients_of(ps, mode) if mode == "eager" else tf.function(lambda: gradients_of(ps, mode))()
        assert sorted(got) == sorted(want), sorted(got)
        for name, w in want.items():
            g = got[name]
            if isinstance(w, list):
                for i, (gi, wi) in enumerate(zip(g, w)):
                    close(gi, wi, f"{mode} gradient of {name}, tensor {i}")
            else:
                close(g, w, f"{mode} gradient of {name}")
    close(hvd.allreduce(tf.ones(2), op=hvd.Sum, name="g.after"), [3.0, 3.0], "global allreduce after")


@case
def session_gradients_on_a_set() -> None:
    """tf.gradients of alltoall (uneven splits) and allgather on a set in a TF1 graph
    run by a Session: each gradient's collective runs on the set."""
    ps, me = mine(), hvd.rank()
    members = ps.ranks
    n, k = len(members), members.index(me)
    splits = [a2a_splits(members, i) for i in range(n)]
    want = expected_gradients(ps)
    rows = [1 + (i % 2) for i in range(n)]
    with tf.Graph().as_default():
        x = tf.constant(value(me, (sum(splits[k]), 2)))
        y, _ = hvd.alltoall(x, splits=splits[k], process_set=ps, name="g.session.a2a")
        gx = tf.gradients(y, x, grad_ys=tf.constant(upstream(me, (sum(s[k] for s in splits), 2))))[0]
        z = tf.constant(value(me, (rows[k], 2)))
        w = hvd.allgather(z, process_set=ps, name="g.session.ag")
        gz = tf.gradients(w, z, grad_ys=tf.constant(upstream(me, (sum(rows), 2))))[0]
        with tf.compat.v1.Session() as sess:
            got_x, got_z = sess.run([gx, gz])
    close(got_x, want["alltoall"], "session alltoall gradient")
    close(got_z, want["allgather"], "session allgather gradient")


@case
def session_graph_on_a_set() -> None:
    ps, me = mine(), hvd.rank()
    with tf.Graph().as_default():
        x = tf.constant(value(me))
        outs = [hvd.allreduce(x * (i + 1), op=hvd.Sum, process_set=ps, name=f"ps.session.{i}")
                for i in range(5)]
        g = hvd.allreduce(x, op=hvd.Sum, name="ps.session.global")
        with tf.compat.v1.Session() as sess:
            got = sess.run(outs + [g])
    for i in range(5):
        close(got[i], (i + 1) * sum(value(r) for r in ps.ranks), f"session allreduce {i}")
    close(got[5], sum(value(r) for r in range(hvd.size())), "session global allreduce")


@case
def outside_the_set_is_refused() -> None:
    """A collective on a set this rank is not in raises tf.errors.InvalidArgumentError,
    as Horovod's ops do (also a ValueError and an HvdliteError), eagerly, while a
    tf.function or a TF1 graph is built, and for the object helpers; a set that is not
    registered raises ValueError on every rank, its listed members included. Nothing is
    submitted, so the next collective runs at once."""
    other = ODD if mine() is EVEN else EVEN
    me = hvd.rank()

    @tf.function
    def gather():
        return hvd.allgather(tf.ones(2), process_set=other)

    def in_graph():
        with tf.Graph().as_default():
            hvd.allreduce(tf.ones(2), process_set=other)

    rows = tf.ones((2 * len(other.ranks), 2))
    calls = {
        "allreduce": lambda: hvd.allreduce(tf.ones(2), process_set=other),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([tf.ones(2)], process_set=other),
        "allgather": lambda: hvd.allgather(tf.ones(2), process_set=other),
        "grouped_allgather": lambda: hvd.grouped_allgather([tf.ones(2)], process_set=other),
        "broadcast": lambda: hvd.broadcast(tf.ones(2), root_rank=other.ranks[0], process_set=other),
        "broadcast_variables": lambda: hvd.broadcast_variables([tf.Variable(tf.ones(2))],
                                                               root_rank=other.ranks[0], process_set=other),
        "alltoall": lambda: hvd.alltoall(rows, process_set=other),
        "reducescatter": lambda: hvd.reducescatter(rows, process_set=other),
        "grouped_reducescatter": lambda: hvd.grouped_reducescatter([rows], process_set=other),
        "barrier": lambda: hvd.barrier(process_set=other),
        "broadcast_object": lambda: hvd.broadcast_object(1, root_rank=other.ranks[0], process_set=other),
        "allgather_object": lambda: hvd.allgather_object(1, process_set=other),
        "tf.function": gather,
        "TF1 graph": in_graph,
    }
    for what, call in calls.items():
        try:
            call()
            raise AssertionError(f"{what} on a set without this rank did not raise")
        except tf.errors.InvalidArgumentError as e:
            assert isinstance(e, ValueError) and isinstance(e, hvd.HvdliteError), type(e).__mro__
            assert f"rank {me} is not in process set {other.process_set_id}" in str(e), str(e)
    fake = hvd.ProcessSet([0, 1, 2])
    fake.process_set_id = 99  # never registered (Horovod's test does this too)
    try:
        hvd.allreduce(tf.ones(2), process_set=fake)
        raise AssertionError("a set that is not registered ran")
    except ValueError as e:
        assert "99" in str(e) and "not registered" in str(e), str(e)
    close(hvd.allreduce(tf.ones(2), op=hvd.Sum, name="ps.after"), [3.0, 3.0], "allreduce after refusal")


@case
def outside_the_set_gets_local_gradients() -> None:
    """DistributedGradientTape and the Keras DistributedOptimizer on a set: members
    average over the set, a rank outside it gets (applies) its own gradients, unreduced,
    as with Horovod; also in tf.function, with backward_passes_per_step and with a
    local variable (scaled by the set's size, as Horovod scales it)."""
    me = hvd.rank()
    c = tf.constant(value(me))
    want = (np.mean([value(r) for r in EVEN.ranks], 0) if me in EVEN.ranks else value(me))
    v = tf.Variable(tf.zeros(4))
    w = tf.Variable(tf.zeros(4))

    def tape_grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * c) + tf.reduce_sum(w * c)
        tape = hvd.DistributedGradientTape(tape, process_set=EVEN)
        tape.register_local_source(w)
        return tape.gradient(loss, [v, w])
    for mode, fn in (("eager", tape_grads), ("function", tf.function(tape_grads))):
        gv, gw = fn()
        close(gv, want, f"{mode} tape on EVEN")
        close(gw, value(me) / len(EVEN.ranks), f"{mode} tape on EVEN, local source")
    for passes in (1, 2):
        kv = keras.Variable(np.zeros(4, np.float32))
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), process_set=EVEN,
                                       backward_passes_per_step=passes,
                                       average_aggregated_gradients=True)
        for _ in range(passes):
            opt.apply_gradients([(c, kv)])
        close(kv.numpy(), -want, f"keras optimizer on EVEN, backward_passes_per_step={passes}")
    close(hvd.allreduce(tf.ones(2), op=hvd.Sum, name="ps.after.local"), [3.0, 3.0], "allreduce after")


@case
def tf1_distributed_optimizer_on_a_set() -> None:
    """hvd.DistributedOptimizer around a tf.compat.v1 optimizer on set EVEN, in a TF1
    graph run by a Session (reference variables, as Horovod's test makes them): EVEN's
    members apply the average of their gradients, rank 1 (outside) its own."""
    tf1 = tf.compat.v1
    me = hvd.rank()
    with tf.Graph().as_default():
        var = tf1.get_variable("v", initializer=[0.0], use_resource=False)
        opt = hvd.DistributedOptimizer(tf1.train.GradientDescentOptimizer(1.0), process_set=EVEN)
        grads = opt.compute_gradients(-float(me) * tf.reduce_sum(var), var_list=[var])
        step = opt.apply_gradients(grads)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(step)
            got = sess.run(var)
    want = np.mean(EVEN.ranks) if me in EVEN.ranks else float(me)
    close(got, [want], "TF1 DistributedOptimizer on EVEN")


@case
def dynamic_sets() -> None:
    me = hvd.rank()
    low = hvd.add_process_set([0, 1])
    if me in (0, 1):
        close(hvd.allreduce(tf.constant(float(me + 1)), op=hvd.Sum, process_set=low, name="ps.dyn"),
              3.0, "dynamic set allreduce")
    hvd.remove_process_set(low)
    try:
        hvd.allreduce(tf.ones(1), process_set=low)
        raise AssertionError("a removed set still ran")
    except ValueError:
        pass


def main() -> None:
    hvd.init(process_sets=[EVEN, ODD])
    assert hvd.size() == 3, "run on 3 ranks"
    run_cases(hvd, sys.argv[1:])


if __name__ == "__main__":
    main()
