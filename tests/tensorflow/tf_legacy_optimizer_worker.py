"""hvd.DistributedOptimizer around TensorFlow 1 optimizers (tf.compat.v1.train), in graphs
run by tf.compat.v1.Session, on 2 ranks. Each rank trains on its half of every global
batch; the reference trains the same graph with the plain optimizer on the whole global
batch in this process alone (or, for Adasum, NumPy applies Adasum to the two ranks'
updates). Prints ``PASS <case> rank <r>``."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402
from tf_cases import case, run_cases  # noqa: E402

tf1 = tf.compat.v1
B, D, STEPS = 4, 3, 4  # rows per rank and step, inputs, steps


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    n = hvd.size()
    x = rng.normal(size=(STEPS, n * B, D)).astype(np.float32)
    y = rng.normal(size=(STEPS, n * B, 1)).astype(np.float32)
    w0 = rng.normal(size=(D, 1)).astype(np.float32)
    return x, y, w0


def mine(a):
    """This rank's rows of every global batch."""
    r = hvd.rank()
    return a[:, r * B:(r + 1) * B]


def train(make_opt, x, y, w0, wrap=None, loss_scale=1.0, steps=STEPS, init_local=True,
          embedding=False, local_bias=False):
    """Build a linear model (a dense weight, a bias; with ``embedding``, a lookup table
    whose gradient is a tf.IndexedSlices) in a new TF1 graph, train it ``steps`` steps
    with ``minimize`` on batches x[t], y[t] and return the final variables and
    global_step. ``wrap`` turns the optimizer into a distributed one."""
    with tf.Graph().as_default():
        xs = tf1.placeholder(tf.float32, [None, D])
        ys = tf1.placeholder(tf.float32, [None, 1])
        w = tf1.get_variable("w", initializer=w0, use_resource=False)
        b = tf1.get_variable("b", initializer=np.zeros(1, np.float32))
        pred = tf.matmul(xs, w) + b
        if embedding:
            table = tf1.get_variable("table", initializer=np.ones((5, 1), np.float32))
            ids = tf.cast(tf.abs(xs[:, 0]) * 2, tf.int32) % 5
            pred = pred + tf.gather(table, ids)
        loss = tf.reduce_mean(tf.square(pred - ys)) * loss_scale
        step = tf1.train.get_or_create_global_step()
        opt = make_opt()
        if wrap is not None:
            opt = wrap(opt)
            if local_bias:
                opt.register_local_var(b)
        train_op = opt.minimize(loss, global_step=step)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            if init_local:
                sess.run(tf1.local_variables_initializer())
            for t in range(steps):
                sess.run(train_op, {xs: x[t], ys: y[t]})
            names = ["w", "b"] + (["table"] if embedding else [])
            values = sess.run([v for v in tf1.global_variables() if v.op.name in names])
            return dict(zip(names, values)), int(sess.run(step)), opt


def close(got, want, what, tol=1e-5):
    got, want = np.asarray(got), np.asarray(want)
    assert np.allclose(got, want, rtol=tol, atol=tol), f"{what}: got {got.ravel()}, want {want.ravel()}"


def same_everywhere(values, what):
    for name, v in values.items():
        everyone = hvd.allgather_object(v)
        for r, theirs in enumerate(everyone):
            close(theirs, v, f"{what}: {name} on rank {r}", tol=0)


def momentum():
    return tf1.train.MomentumOptimizer(0.05, 0.9)


@case
def average_matches_single_process() -> None:
    """Average (the default) over the ranks' halves equals one process on the global
    batch; every option that keeps the mathematics the same gives the same weights
    (gradient_predivide_factor, groups, fp16 compression within fp16's precision), and
    op=Sum equals the reference with the loss multiplied by the number of ranks."""
    x, y, w0 = data()
    ref, ref_step, _ = train(momentum, x, y, w0)
    assert ref_step == STEPS, ref_step
    variants = {
        "default": (dict(), 1.0, 1e-5),
        "gradient_predivide_factor": (dict(gradient_predivide_factor=2.0), 1.0, 1e-5),
        "groups=2": (dict(groups=2), 1.0, 1e-5),
        "compression=fp16": (dict(compression=hvd.Compression.fp16), 1.0, 3e-3),
    }
    for what, (options, _, tol) in variants.items():
        got, step, opt = train(momentum, mine(x), mine(y), w0,
                               wrap=lambda o, options=options: hvd.DistributedOptimizer(o, **options))
        assert isinstance(opt, tf1.train.Optimizer), type(opt)
        assert step == STEPS, f"{what}: global_step {step}"
        for name in ref:
            close(got[name], ref[name], f"{what}: {name}", tol)
        same_everywhere(got, what)
    ref_sum, _, _ = train(momentum, x, y, w0, loss_scale=float(hvd.size()))
    got, _, _ = train(momentum, mine(x), mine(y), w0, wrap=lambda o: hvd.DistributedOptimizer(o, op=hvd.Sum))
    for name in ref_sum:
        close(got[name], ref_sum[name], f"op=Sum: {name}")


@case
def sparse_gradients_and_local_variables() -> None:
    """An embedding's tf.IndexedSlices gradient is combined (allgathered, or densified
    with sparse_as_dense) as one process on the global batch computes it; a variable
    registered with register_local_var keeps its own gradient, divided by the number
    of ranks (the reference: that rank's gradient alone, scaled so)."""
    x, y, w0 = data(1)
    ref, _, _ = train(lambda: tf1.train.GradientDescentOptimizer(0.1), x, y, w0, embedding=True)
    for sad in (False, True):
        got, _, _ = train(lambda: tf1.train.GradientDescentOptimizer(0.1), mine(x), mine(y), w0,
                          embedding=True, wrap=lambda o: hvd.DistributedOptimizer(o, sparse_as_dense=sad))
        for name in ref:
            close(got[name], ref[name], f"sparse_as_dense={sad}: {name}")
    # One step, the bias local: the weights as one process, the bias from this rank's
    # own rows, its gradient divided by the number of ranks.
    got, _, _ = train(lambda: tf1.train.GradientDescentOptimizer(0.1), mine(x), mine(y), w0,
                      wrap=hvd.DistributedOptimizer, local_bias=True, steps=1)
    ref_all, _, _ = train(lambda: tf1.train.GradientDescentOptimizer(0.1), x, y, w0, steps=1)
    ref_own, _, _ = train(lambda: tf1.train.GradientDescentOptimizer(0.1 / hvd.size()), mine(x), mine(y),
                          w0, steps=1)
    close(got["w"], ref_all["w"], "local bias: w")
    close(got["b"], ref_own["b"], "local bias: b")


@case
def backward_passes_per_step_sums_then_applies() -> None:
    """backward_passes_per_step=2: the gradients of two steps are summed (averaged with
    average_aggregated_gradients) and applied once, every second step, while
    global_step counts every step. The reference (NumPy) applies Momentum, every second
    step, to the sum (mean) of the two steps' global-batch gradients."""
    x, y, w0 = data(2)
    lr, mu = 0.05, 0.9
    for average in (False, True):
        got, step, _ = train(lambda: tf1.train.MomentumOptimizer(lr, mu), mine(x), mine(y), w0,
                             wrap=lambda o: hvd.DistributedOptimizer(
                                 o, backward_passes_per_step=2, average_aggregated_gradients=average))
        assert step == STEPS, f"global_step {step}"
        w, b = w0.astype(np.float64), np.zeros(1)
        aw, ab = np.zeros_like(w), np.zeros_like(b)
        for t in range(0, STEPS, 2):
            gw, gb = np.zeros_like(w), np.zeros_like(b)
            for s in (t, t + 1):
                err = x[s] @ w + b - y[s]
                gw += 2 * x[s].T @ err / len(err)
                gb += 2 * err.sum(0) / len(err)
            scale = 0.5 if average else 1.0
            aw, ab = mu * aw + scale * gw, mu * ab + scale * gb
            w, b = w - lr * aw, b - lr * ab
        close(got["w"], w, f"average_aggregated_gradients={average}: w", 1e-4)
        close(got["b"], b, f"average_aggregated_gradients={average}: b", 1e-4)
        same_everywhere(got, f"backward_passes_per_step, average={average}")


def adasum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dot = float(np.dot(a.ravel().astype(np.float64), b.ravel()))
    na, nb = float(np.dot(a.ravel(), a.ravel())), float(np.dot(b.ravel(), b.ravel()))
    return (1 - dot / (2 * na)) * a + (1 - dot / (2 * nb)) * b


@case
def adasum_combines_the_updates() -> None:
    """op=Adasum: each rank takes its own plain SGD step, and the two steps' changes of
    every variable are combined with Adasum (NumPy's formula on both ranks' changes)."""
    assert hvd.size() == 2
    x, y, w0 = data(3)
    got, step, _ = train(lambda: tf1.train.GradientDescentOptimizer(0.1), mine(x), mine(y), w0,
                         wrap=lambda o: hvd.DistributedOptimizer(o, op=hvd.Adasum), steps=1)
    assert step == 1, step
    deltas = []
    for r in range(2):
        xr, yr = x[0, r * B:(r + 1) * B], y[0, r * B:(r + 1) * B]
        err = xr @ w0 - yr
        deltas.append((-0.1 * 2 * xr.T @ err / len(err), -0.1 * 2 * err.sum(0) / len(err)))
    close(got["w"], w0 + adasum(deltas[0][0], deltas[1][0]), "Adasum w", 1e-4)
    close(got["b"], adasum(deltas[0][1], deltas[1][1]), "Adasum b", 1e-4)


@case
def delegation_and_errors() -> None:
    """get_slot, get_slot_names and variables are the wrapped optimizer's; eagerly,
    backward_passes_per_step > 1 is a ValueError (as in Horovod), so is a sparse
    gradient to sum without sparse_as_dense; other objects than optimizers are refused
    with a TypeError; the next collective runs."""
    with tf.Graph().as_default():
        v = tf1.get_variable("v", initializer=np.ones(2, np.float32))
        inner = momentum()
        opt = hvd.DistributedOptimizer(inner)
        opt.minimize(tf.reduce_sum(v * v))
        assert opt.get_slot_names() == inner.get_slot_names() == ["momentum"], opt.get_slot_names()
        assert opt.get_slot(v, "momentum") is inner.get_slot(v, "momentum")
        assert opt.variables() == inner.variables()
    try:
        hvd.DistributedOptimizer(momentum(), backward_passes_per_step=2)
        raise AssertionError("eager backward_passes_per_step > 1 was accepted")
    except ValueError as e:
        assert "graph" in str(e), str(e)
    with tf.Graph().as_default():
        table = tf1.get_variable("table", initializer=np.ones((4, 1), np.float32))
        loss = tf.reduce_sum(tf.gather(table, [0, 2]))
        try:
            hvd.DistributedOptimizer(tf1.train.GradientDescentOptimizer(0.1),
                                     backward_passes_per_step=2).minimize(loss)
            raise AssertionError("a sparse gradient was summed without sparse_as_dense")
        except ValueError as e:
            assert "sparse_as_dense" in str(e), str(e)
    try:
        hvd.DistributedOptimizer(object())
        raise AssertionError("an object that is no optimizer was wrapped")
    except TypeError as e:
        assert "optimizer" in str(e), str(e)
    got = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="legacy.after")
    close(got, [float(hvd.size())], "allreduce after")


def main() -> None:
    hvd.init()
    run_cases(hvd, sys.argv[1:])


if __name__ == "__main__":
    main()
