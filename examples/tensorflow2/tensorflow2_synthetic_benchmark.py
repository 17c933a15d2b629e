"""Synthetic TensorFlow 2 training benchmark with hvdlite (in the spirit of Horovod's).

Trains on one random batch repeated (synthetic data, nothing is downloaded) and reports
samples per second per rank and in total:

    hvdlite-run -np 2 python examples/tensorflow2/tensorflow2_synthetic_benchmark.py --model resnet
    python examples/tensorflow2/tensorflow2_synthetic_benchmark.py --model mlp   # one process

Models: ``mlp`` (20 Dense+ReLU layers 1024 -> 700 (x19) -> 10, 9.56 M parameters,
communication-heavy), ``resnet`` (a ResNet-like CNN on 32x32x3 images, 3 stages of 2 basic
blocks with 64/128/256 channels, 2.78 M parameters, compute-heavy), or any
``keras.applications`` name such as ``ResNet50`` (224x224x3, random weights).
``--api loop`` runs a custom ``tf.function`` step with ``hvd.DistributedGradientTape``;
``--api fit`` runs Keras ``model.fit`` with ``hvd.DistributedOptimizer``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

PARAMS = {"mlp": 9_557_110, "resnet": 2_777_674}


def mlp() -> Any:
    """1024 -> 700 (x19) -> 10, ReLU between layers: 9,557,110 parameters."""
    import keras
    return keras.Sequential([keras.Input((1024,))] +
                            [keras.layers.Dense(700, activation="relu") for _ in range(19)] +
                            [keras.layers.Dense(10)], name="mlp")


def resnet() -> Any:
    """Stem + 3 stages x 2 basic blocks (64/128/256) + dense: 2,777,674 parameters."""
    import keras
    from keras import layers

    def block(x: Any, width: int, stride: int) -> Any:
        y = layers.Conv2D(width, 3, strides=stride, padding="same", use_bias=False)(x)
        y = layers.ReLU()(layers.BatchNormalization()(y))
        y = layers.BatchNormalization()(layers.Conv2D(width, 3, padding="same", use_bias=False)(y))
        shortcut = x
        if stride != 1 or x.shape[-1] != width:
            shortcut = layers.BatchNormalization()(
                layers.Conv2D(width, 1, strides=stride, use_bias=False)(x))
        return layers.ReLU()(layers.Add()([y, shortcut]))

    inputs = keras.Input((32, 32, 3))
    x = layers.ReLU()(layers.BatchNormalization()(
        layers.Conv2D(64, 3, padding="same", use_bias=False)(inputs)))
    for i, width in enumerate((64, 128, 256)):
        for j in range(2):
            x = block(x, width, 2 if (j == 0 and i > 0) else 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x), name="resnet")


MODELS = {"mlp": (mlp, (1024,)), "resnet": (resnet, (32, 32, 3))}


def build(name: str) -> tuple[Any, tuple[int, ...]]:
    """The model and its input shape (one sample)."""
    if name in MODELS:
        fn, shape = MODELS[name]
        return fn(), shape
    import keras
    app = getattr(keras.applications, name)
    return app(weights=None, input_shape=(224, 224, 3), classes=10), (224, 224, 3)


def synthetic_batch(shape: tuple[int, ...], batch_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch_size,) + shape).astype(np.float32),
            rng.integers(0, 10, size=batch_size).astype(np.int32))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="resnet", help="mlp, resnet or a keras.applications name")
    p.add_argument("--api", choices=["loop", "fit"], default="loop")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--fp16-allreduce", action="store_true", help="float16 on the wire")
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
    import hvdlite.tensorflow.keras as hvdk

    hvd.init()
    rank, size = hvd.rank(), hvd.size()  # kept: another rank may shut down first at the end
    keras.utils.set_random_seed(1234)
    model, shape = build(args.model)
    n_params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = synthetic_batch(shape, args.batch_size, seed=rank)

    def log(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    log(f"Model: {args.model} ({n_params:,} parameters), API: {args.api}, batch size: "
        f"{args.batch_size} per rank, ranks: {size}")

    if args.api == "loop":
        opt.build(model.trainable_variables)
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        xt, yt = tf.constant(x), tf.constant(y)

        def run(n: int) -> None:
            for _ in range(n):
                loss = step(xt, yt)
            loss.numpy()
    else:
        model.compile(optimizer=hvdk.DistributedOptimizer(opt, compression=compression), loss=loss_fn)
        data = tf.data.Dataset.from_tensors((x, y)).repeat()
        callbacks = [hvdk.callbacks.BroadcastGlobalVariablesCallback(0)]

        def run(n: int) -> None:
            model.fit(data, steps_per_epoch=n, epochs=1, verbose=0, callbacks=callbacks)

    log("Running warmup...")
    run(args.num_warmup_batches)
    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        t0 = time.perf_counter()
        run(args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / (time.perf_counter() - t0)
        log(f"Iter #{i}: {rate:.1f} samples/sec per rank")
        rates.append(rate)
    mean, conf = float(np.mean(rates)), 1.96 * float(np.std(rates))
    log(f"Samples/sec per rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total samples/sec on {size} rank(s): {size * mean:.1f} +-{size * conf:.1f}")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
