"""Process sets in the TensorFlow front end, on 3 ranks: sets [0, 2] and [1] registered
at init, and a dynamic one. Every collective kind runs on a set eagerly, in tf.function
and in a TF1 Session graph, checked against NumPy over the set's members; the tape and
the Keras optimizer average over their set only; errors for a rank outside the set.
Prints ``PASS <case> rank <r>``."""
from __future__ import annotations

import os
import sys

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
    other = ODD if mine() is EVEN else EVEN

    @tf.function
    def gather():
        return hvd.allgather(tf.ones(2), process_set=other)

    for what, call in (("allreduce", lambda: hvd.allreduce(tf.ones(2), process_set=other)),
                       ("tape", lambda: hvd.DistributedGradientTape(tf.GradientTape(), process_set=other)),
                       ("function", gather)):
        try:
            call()
            raise AssertionError(f"{what} on a set without this rank did not raise")
        except ValueError as e:
            assert "not" in str(e) and "set" in str(e), str(e)
    close(hvd.allreduce(tf.ones(2), op=hvd.Sum, name="ps.after"), [3.0, 3.0], "allreduce after refusal")


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
