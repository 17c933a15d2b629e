"""Data-parallel Keras 3 ``model.fit`` with hvdlite's DistributedOptimizer and callbacks.

Data: scikit-learn's bundled digits set (1,797 8x8 images, shipped with the package;
nothing is downloaded). Each rank fits on its own shard; the gradients of every step are
averaged over the ranks; rank 0's initial weights are broadcast; the learning rate,
scaled by the number of ranks, is warmed up over the first epochs; the logged metrics
are averaged over the ranks.

    hvdlite-run -np 2 python examples/tensorflow2/tensorflow2_keras_digits.py
    python examples/tensorflow2/tensorflow2_keras_digits.py                # one process

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
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    return x[:1500], y[:1500], x[1500:], y[1500:]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.02, help="learning rate of one rank (scaled by the ranks)")
    p.add_argument("--warmup-epochs", type=int, default=2)
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

    import hvdlite.tensorflow.keras as hvd

    hvd.init()  # hvdlite
    rank, size = hvd.rank(), hvd.size()

    x_train, y_train, x_test, y_test = load_digits_split()
    # hvdlite: every rank fits on its own shard (same number of samples on every rank)
    per_rank = len(x_train) // size
    x_shard, y_shard = x_train[rank::size][:per_rank], y_train[rank::size][:per_rank]
    x_val, y_val = x_test[rank::size], y_test[rank::size]

    keras.utils.set_random_seed(rank)  # different on purpose: the broadcast aligns them
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    lr = args.lr * size  # hvdlite: scale the rate with the global batch
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9))  # hvdlite
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # hvdlite: start from rank 0's state
        hvd.callbacks.MetricAverageCallback(),  # hvdlite: log metrics averaged over ranks
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=args.warmup_epochs,
                                                 verbose=1),  # hvdlite: ramp up to lr
    ]
    history = model.fit(x_shard, y_shard, batch_size=args.batch_size, epochs=args.epochs,
                        validation_data=(x_val, y_val), callbacks=callbacks,
                        verbose=2 if rank == 0 else 0)  # hvdlite: log on rank 0 only
    if rank == 0:
        print(f"validation accuracy (averaged over ranks): {history.history['val_accuracy'][-1]:.4f}")
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if rank == 0:
        print(f"final test accuracy: {accuracy:.4f}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
