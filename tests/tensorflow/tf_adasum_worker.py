"""op=Adasum in the TensorFlow front end, on 1, 2 or 4 ranks (3 for the error): the
allreduce, DistributedGradientTape (eagerly and in tf.function, grouped too) and the
Keras DistributedOptimizer, each against the pairwise formula
``(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b`` applied in NumPy up the same tree
(ranks 0+1, 2+3, then the two results). Prints ``PASS <case> rank <r>``."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402
from tf_cases import case, run_cases  # noqa: E402

def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ab, aa, bb = a @ b, a @ a, b @ b
    return (1 - ab / (2 * aa) if aa else 1.0) * a + (1 - ab / (2 * bb) if bb else 1.0) * b


def reference(vectors: list[np.ndarray]) -> np.ndarray:
    level = [np.asarray(v, np.float64).ravel() for v in vectors]
    while len(level) > 1:
        level = [combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def data(r: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(100 * seed + r).standard_normal(shape)


@case
def allreduce_matches_formula() -> None:
    me, n = hvd.rank(), hvd.size()
    for dt, tol in ((tf.float64, 1e-10), (tf.float32, 1e-5), (tf.float16, 3e-2)):
        x = tf.constant(data(me, (11, 3)), dtype=dt)
        ref = reference([tf.cast(tf.constant(data(r, (11, 3)), dt), tf.float64).numpy() for r in range(n)])
        for mode, fn in (("eager", lambda t: hvd.allreduce(t, op=hvd.Adasum, name=f"tf.adasum.{dt.name}")),
                         ("function", tf.function(lambda t: hvd.allreduce(t, op=hvd.Adasum)))):
            got = fn(x)
            assert got.dtype == dt, (mode, got.dtype)
            assert np.allclose(tf.cast(got, tf.float64).numpy().ravel(), ref, rtol=tol, atol=tol), (mode, dt)


@case
def gradient_tape_combines_gradients() -> None:
    me, n = hvd.rank(), hvd.size()
    c1, c2 = data(me, (5,), seed=1), data(me, (2, 3), seed=2)
    v1 = tf.Variable(tf.zeros(5, tf.float64))
    v2 = tf.Variable(tf.zeros((2, 3), tf.float64))

    def grads(groups):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v1 * c1) + tf.reduce_sum(v2 * c2)  # gradients: c1, c2
        tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum, groups=groups)
        return tape.gradient(loss, [v1, v2])

    want1 = reference([data(r, (5,), seed=1) for r in range(n)])
    want2 = reference([data(r, (2, 3), seed=2) for r in range(n)])
    for mode, fn in (("eager", grads), ("function", tf.function(grads))):
        for groups in (None, 1):
            g1, g2 = fn(groups)
            assert np.allclose(g1.numpy().ravel(), want1, atol=1e-10), (mode, groups, g1, want1)
            assert np.allclose(g2.numpy().ravel(), want2, atol=1e-10), (mode, groups, g2, want2)
    # Sparse gradients cannot be combined with Adasum unless made dense.
    emb = tf.Variable(tf.ones((4, 2), tf.float64))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(emb, [1, 3]))
    try:
        hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [emb])
        raise AssertionError("sparse Adasum did not raise")
    except ValueError as e:
        assert "sparse_as_dense" in str(e), e
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(emb, [1, 3])) * (me + 1)
    (g,) = hvd.DistributedGradientTape(tape, op=hvd.Adasum, sparse_as_dense=True).gradient(loss, [emb])
    rows = [np.array([[0, 0], [r + 1, r + 1], [0, 0], [r + 1, r + 1]], np.float64) for r in range(n)]
    assert np.allclose(g.numpy().ravel(), reference(rows)), g


@case
def keras_optimizer_applies_the_adasum() -> None:
    me, n = hvd.rank(), hvd.size()
    v = keras.Variable(np.zeros(6), dtype="float64")
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0), op=hvd.Adasum)
    opt.apply_gradients([(tf.constant(data(me, (6,), seed=3)), v)])
    want = -reference([data(r, (6,), seed=3) for r in range(n)])
    assert np.allclose(np.asarray(v.numpy()), want, atol=1e-10), (v.numpy(), want)


@case
def not_a_power_of_two() -> None:
    try:
        hvd.allreduce(tf.ones(4, tf.float32), op=hvd.Adasum, name="tf.adasum.three")
        raise AssertionError("Adasum on 3 ranks did not raise")
    except Exception as e:  # noqa: BLE001 - the type is checked below
        assert isinstance(e, tf.errors.OpError) or "power of" in str(e), repr(e)
        assert "power of" in str(e) or "power-of" in str(e), str(e)
    got = hvd.allreduce(tf.ones(2), op=hvd.Sum, name="tf.adasum.after")
    assert np.allclose(got.numpy(), 3.0), got


def main() -> None:
    hvd.init()
    run_cases(hvd, sys.argv[1:])


if __name__ == "__main__":
    main()
