"""Horovod-style elastic TensorFlow/Keras training, used by the elastic tests.

``--mode fit``: ``model.fit`` with ``KerasState`` and the three Keras state callbacks.
``--mode loop``: a custom loop over ``tf.GradientTape`` with ``TensorFlowKerasState``.
``HVDLITE_TEST_KILL="R:S"``: the process that started as rank R kills itself with
SIGKILL before its step S. Each survivor writes ``OUT/<pid>.json`` (ranks, a hash of
the final weights, the loss, resets).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["fit", "loop"], default="fit")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()

    hvd.init()
    first_rank, first_size = hvd.rank(), hvd.size()
    kill = {int(r): int(s) for r, s in (item.split(":") for item in
                                       filter(None, os.environ.get("HVDLITE_TEST_KILL", "").split(",")))}
    my_kill = kill.get(first_rank)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(384, 8)).astype(np.float32)
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(384, 1))).astype(np.float32)
    keras.utils.set_random_seed(50 + first_rank)  # different weights until the first sync
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(1)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    steps = {"n": 0}
    resets = []

    def maybe_die() -> None:
        if my_kill is not None and steps["n"] == my_kill:
            os.kill(os.getpid(), signal.SIGKILL)
        steps["n"] += 1

    if args.mode == "fit":
        model.compile(optimizer=opt, loss="mse")
        state = hvd.elastic.KerasState(model, batch=0, epoch=0)

        class Die(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                maybe_die()

        callbacks = [Die(), hvd.elastic.UpdateEpochStateCallback(state),
                     hvd.elastic.UpdateBatchStateCallback(state),
                     hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]
        state.register_reset_callbacks([lambda: resets.append(hvd.size())])

        @hvd.elastic.run
        def train(state):
            # Each rank's share of the data for the world of the moment.
            n, r = hvd.size(), hvd.rank()
            state.model.fit(x[r::n], y[r::n], batch_size=16, shuffle=False, verbose=0,
                            initial_epoch=state.epoch, epochs=args.epochs, callbacks=callbacks)
    else:
        model.build((None, 8))
        opt.build(model.trainable_variables)
        state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0, batch=0)
        state.register_reset_callbacks([lambda: resets.append(hvd.size())])

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @hvd.elastic.run
        def train(state):
            while state.epoch < args.epochs:
                n, r = hvd.size(), hvd.rank()
                xs, ys = x[r::n], y[r::n]
                batches = len(xs) // 16
                for b in range(state.batch, batches):
                    maybe_die()
                    step(xs[b * 16:(b + 1) * 16], ys[b * 16:(b + 1) * 16])
                    state.batch = b + 1
                    if state.batch % 2 == 0:
                        state.commit()
                state.epoch += 1
                state.batch = 0
                state.commit()

    train(state)
    weights = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    loss = float(np.mean((model(x).numpy() - y) ** 2))
    with open(os.path.join(args.out, f"{os.getpid()}.json"), "w") as f:
        json.dump({"first_rank": first_rank, "first_size": first_size, "rank": hvd.rank(),
                   "size": hvd.size(), "weights_sha": hashlib.sha256(weights.tobytes()).hexdigest(),
                   "loss": loss, "resets": resets}, f)


if __name__ == "__main__":
    main()
