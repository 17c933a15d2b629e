"""Data-parallel training with a custom TensorFlow 2 loop and hvdlite's DistributedGradientTape.

Data: scikit-learn's bundled digits set (1,797 8x8 images, shipped with the package; nothing
is downloaded). Each rank trains on its own shard of the training set; every step
averages the gradients of all ranks, so the model sees a global batch of
``--batch-size x ranks`` images per step.

    hvdlite-run -np 2 python examples/tensorflow2/tensorflow2_digits_custom_loop.py
    python examples/tensorflow2/tensorflow2_digits_custom_loop.py           # one process

The lines that make it distributed are marked ``# hvdlite``.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def load_digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Digits scaled to [0, 1], shuffled with a fixed seed, 1,500 train / 297 test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    return x[:1500], y[:1500], x[1500:], y[1500:]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.001, help="learning rate of one rank (scaled by the ranks)")
    p.add_argument("--threads", type=int, default=1,
                   help="TensorFlow intra-op and inter-op threads per rank (0: TensorFlow's default)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    if args.threads > 0:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    import hvdlite.tensorflow as hvd

    hvd.init()  # hvdlite
    rank, size = hvd.rank(), hvd.size()

    x_train, y_train, x_test, y_test = load_digits_split()
    # hvdlite: every rank takes its own shard, with the same number of full batches.
    x_shard, y_shard = x_train[rank::size], y_train[rank::size]
    steps = (len(x_train) // size) // args.batch_size

    keras.utils.set_random_seed(rank)  # different on purpose: the broadcast aligns them
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    opt = keras.optimizers.Adam(args.lr * size)  # hvdlite: scale the rate with the global batch
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    # hvdlite: start every rank from rank 0's weights and optimizer state.
    opt.build(model.trainable_variables)
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(opt.variables, root_rank=0)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)  # hvdlite: average gradients over ranks
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng = np.random.default_rng(100 + rank)
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_shard))
        losses = []
        for s in range(steps):
            idx = order[s * args.batch_size:(s + 1) * args.batch_size]
            losses.append(float(train_step(tf.constant(x_shard[idx]), tf.constant(y_shard[idx]))))
        # hvdlite: the mean loss over all ranks, for the log
        mean_loss = float(hvd.allreduce(tf.constant(np.mean(losses)), name="epoch_loss"))
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {mean_loss:.4f}", flush=True)

    logits = model(x_test, training=False)
    accuracy = float(np.mean(np.argmax(logits.numpy(), axis=1) == y_test))
    if rank == 0:
        print(f"final test accuracy: {accuracy:.4f}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
