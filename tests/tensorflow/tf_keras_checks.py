"""Keras 3: model.fit with DistributedOptimizer against single-process training on the
global batch, the callbacks, load_model and backward_passes_per_step. Each rank trains on
its own slice of every global batch; the references train in this process with plain
Keras/TensorFlow and no hvdlite."""
from __future__ import annotations

import os
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

from tf_checks_common import N, R, FAILURES, check, expect, expect_close, hvd

import hvdlite.tensorflow.keras as hvdk

B, D, H = 4, 5, 8  # per-rank batch, inputs, hidden units


def global_data(steps, seed=0, outputs=2):
    rng = np.random.default_rng(500 + seed)
    x = rng.normal(size=(steps * B * N, D)).astype(np.float32)
    y = rng.normal(size=(steps * B * N, outputs)).astype(np.float32)
    return x, y


def local_slice(a):
    """This rank's rows of every global batch (global batch t = rows t*B*N ... )."""
    steps = a.shape[0] // (B * N)
    return np.concatenate([a[t * B * N + R * B:t * B * N + (R + 1) * B] for t in range(steps)])


def make_model(seed, outputs=2):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((D,)), keras.layers.Dense(H, activation="tanh"),
                             keras.layers.Dense(outputs)])


def weights_equal_everywhere(weights, what):
    for i, w in enumerate(weights):
        everyone = hvd.allgather(tf.constant(np.asarray(w)[None]))
        expect(np.allclose(np.asarray(everyone), np.asarray(w)[None], rtol=1e-6, atol=1e-7),
               f"{what}: weight {i} differs between ranks")


def root_weights(model):
    return hvd.broadcast_object([w.copy() for w in model.get_weights()], root_rank=0)


def fit_against_single_process(build, make_opt, x, y, seed, build_reference=None, **options):
    """``build(seed + rank)`` (different weights on every rank) trained with ``model.fit``
    and ``hvdk.DistributedOptimizer(make_opt(), **options)`` on this rank's rows of every
    global batch, from rank 0's weights; and ``build_reference`` (default ``build``)
    trained in this process alone on the global batches with ``make_opt()``, from the
    same weights. Returns both models."""
    model = build(seed + R)
    init = root_weights(model)
    model.compile(optimizer=hvdk.DistributedOptimizer(make_opt(), **options), loss="mse")
    return model, fit_both(model, init, make_opt, x, y, build_reference or build)


def fit_both(model, init, make_opt, x, y, build_reference=make_model):
    """Fit the compiled distributed ``model`` on this rank's rows, after broadcasting
    rank 0's weights, and a ``build_reference(1)`` model from ``init`` in this process
    alone on the global batches with ``make_opt()``. Returns the reference."""
    model.fit(local_slice(x), local_slice(y), batch_size=B, shuffle=False, verbose=0,
              callbacks=[hvdk.BroadcastGlobalVariablesCallback(0)])
    ref = build_reference(1)
    ref.set_weights(init)
    ref.compile(optimizer=make_opt(), loss="mse")
    ref.fit(x, y, batch_size=B * N, shuffle=False, verbose=0)
    return ref


@check
def fit_with_distributed_optimizer_matches_single_process():
    steps = 3
    x, y = global_data(steps)
    model, ref = fit_against_single_process(make_model, lambda: keras.optimizers.Adam(0.01), x, y,
                                            seed=100)
    opt = model.optimizer
    expect(isinstance(opt, keras.optimizers.Adam), "DistributedOptimizer is not an Adam")
    for i, (g, r) in enumerate(zip(model.get_weights(), ref.get_weights())):
        expect_close(g, r, f"fit weight {i} vs single process", rtol=1e-5, atol=1e-6)
    weights_equal_everywhere(model.get_weights(), "fit")
    expect(int(opt.iterations.numpy()) == steps, f"iterations {int(opt.iterations.numpy())}")


@check
def keras_collectives_return_tensors():
    """The Keras modules' allreduce, allgather, broadcast and reducescatter return a
    tf.Tensor eagerly, as Horovod's do (its Keras module returns what
    horovod.tensorflow's collective returns), with values checked against NumPy over
    all ranks; in a TensorFlow 1 graph they run the op and return NumPy, as Horovod
    runs it in Keras's session."""
    import hvdlite.keras as hk
    mine = np.arange(2 * N, dtype=np.float32).reshape(N, 2) + 10 * R
    every = [np.arange(2 * N, dtype=np.float32).reshape(N, 2) + 10 * r for r in range(N)]
    for module in (hvdk, hk):
        results = {
            "allreduce": (module.allreduce(mine, op=module.Sum, name=f"{module.__name__}.ar"),
                          sum(every)),
            "allreduce average": (module.allreduce(mine, name=f"{module.__name__}.avg"),
                                  sum(every) / N),
            "allgather": (module.allgather(mine, name=f"{module.__name__}.ag"), np.concatenate(every)),
            "broadcast": (module.broadcast(mine, N - 1, name=f"{module.__name__}.bc"), every[N - 1]),
            "reducescatter": (module.reducescatter(mine, op=module.Sum, name=f"{module.__name__}.rs"),
                              sum(every)[R:R + 1]),
        }
        for what, (got, want) in results.items():
            expect(isinstance(got, tf.Tensor) and not isinstance(got, np.ndarray),
                   f"{module.__name__}.{what} returned {type(got)}")
            expect_close(got.numpy(), want, f"{module.__name__}.{what}")
    with tf.Graph().as_default():
        got = hvdk.allreduce(mine, op=hvdk.Sum, name="keras.graph.ar")
    expect(isinstance(got, np.ndarray), f"allreduce in a TF1 graph returned {type(got)}")
    expect_close(got, sum(every), "allreduce in a TF1 graph")


@check
def keras2_calls_scripts_make_are_bridged():
    """Calls that Horovod's TensorFlow 2 examples and Keras tests make in Keras 2's terms
    work with Keras 3 through hvdlite: ``opt.variables()`` on any optimizer (a list that
    is also callable), broadcast from rank 0 inside tf.function after a first step as
    Horovod's synthetic benchmark does; the distributed optimizer's ``lr`` (assign,
    numpy, tf.keras.backend.set_value, the setter); compile's
    ``experimental_run_tf_function`` with a distributed optimizer (a plain one still
    gets Keras's TypeError); ``compute_gradients`` then ``apply_gradients`` (with Keras
    2's ``experimental_aggregate_gradients``) combining the gradients once (op=Sum
    against NumPy's sum over the ranks)."""
    plain = keras.optimizers.SGD(0.1)
    expect(plain.variables() == plain.variables and isinstance(plain.variables, list),
           "opt.variables() is not the list opt.variables")
    model = make_model(40 + R)
    x = tf.constant(global_data(1, seed=8)[0][:B])

    @tf.function
    def step(first):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        plain.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(plain.variables(), root_rank=0)
    step(True)
    step(False)
    weights_equal_everywhere(model.get_weights() + [v.numpy() for v in plain.variables()],
                             "after opt.variables() broadcast")

    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01))
    expect(abs(float(opt.lr.numpy()) - 0.01) < 1e-7, f"lr {opt.lr}")
    opt.lr.assign(0.02)
    expect(abs(float(opt.learning_rate.numpy()) - 0.02) < 1e-7, "lr.assign did not set learning_rate")
    tf.keras.backend.set_value(opt.lr, 0.03)
    expect(abs(float(opt.learning_rate.numpy()) - 0.03) < 1e-7, "set_value(opt.lr) did not set it")
    opt.lr = 0.04
    expect(abs(float(opt.learning_rate.numpy()) - 0.04) < 1e-7, "opt.lr = x did not set it")
    m = make_model(41)
    m.compile(optimizer=opt, loss="mse", experimental_run_tf_function=False)
    expect(m.optimizer is opt, "compile with experimental_run_tf_function lost the optimizer")
    try:
        make_model(42).compile(optimizer="sgd", loss="mse", experimental_run_tf_function=False)
        expect(False, "a plain optimizer's compile accepted experimental_run_tf_function")
    except TypeError:
        pass

    summed = hvdk.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvdk.Sum)
    v = tf.Variable([1.0, 2.0])
    pairs = summed.compute_gradients(lambda: tf.reduce_sum(v * float(R + 1)), [v])
    want = sum(r + 1 for r in range(N))
    expect_close(pairs[0][0].numpy(), [want, want], "compute_gradients with op=Sum")
    summed.apply_gradients(pairs, experimental_aggregate_gradients=False)
    expect_close(v.numpy(), [1.0 - want, 2.0 - want], "apply_gradients after compute_gradients")
    try:
        summed.apply_gradients(pairs, no_such_argument=1)
        expect(False, "apply_gradients accepted an unknown keyword")
    except TypeError:
        pass


@check
def mixed_float16_fit_skips_a_non_finite_step_on_every_rank():
    """Under the mixed_float16 policy, compile wraps DistributedOptimizer in Keras's
    LossScaleOptimizer, which skips a step whose gradients are not finite. Only the last
    rank's part of the first global batch holds an inf, so only that rank's own gradients
    are non-finite; every rank must still skip that step (a rank skipping alone would
    leave the others waiting in the gradient allreduce), and training must match one
    process on the global batch. Also with the wrapping the other way round,
    DistributedOptimizer(LossScaleOptimizer(opt))."""
    steps = 3
    x, y = global_data(steps, seed=4)
    x[(N - 1) * B, 0] = np.inf  # first global batch, last rank's rows
    for order, make_opt in (("compile wraps", lambda: keras.optimizers.SGD(0.1)),
                            ("wrapped by the user", lambda: keras.optimizers.LossScaleOptimizer(
                                keras.optimizers.SGD(0.1)))):
        keras.mixed_precision.set_dtype_policy("mixed_float16")
        try:
            model, ref = fit_against_single_process(make_model, make_opt, x, y, seed=300)
        finally:
            keras.mixed_precision.set_dtype_policy("float32")
        opt = model.optimizer
        expect(isinstance(opt, keras.optimizers.LossScaleOptimizer), f"{order}: optimizer is {type(opt)}")
        scale, ref_scale = float(opt.dynamic_scale.numpy()), float(ref.optimizer.dynamic_scale.numpy())
        expect(scale == ref_scale == 2.0 ** 14, f"{order}: loss scale {scale}, single process {ref_scale}")
        expect(int(opt.iterations.numpy()) == steps - 1, f"{order}: iterations {int(opt.iterations.numpy())}")
        for i, (g, r) in enumerate(zip(model.get_weights(), ref.get_weights())):
            expect_close(g, r, f"{order}: mixed_float16 fit weight {i} vs single process", rtol=2e-3, atol=2e-4)
        weights_equal_everywhere(model.get_weights(), f"{order}: mixed_float16 fit")


@check
def fit_sparse_embedding_gradients():
    """Embedding gradients are tf.IndexedSlices inside fit: allgathered by default,
    allreduced dense with sparse_as_dense; both equal single-process training."""
    steps, V = 2, 11
    rng = np.random.default_rng(7)
    ids = rng.integers(0, V, size=(steps * B * N, 3)).astype(np.int32)
    y = rng.normal(size=(steps * B * N, 1)).astype(np.float32)

    def build(seed):
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(V, 4),
                                 keras.layers.Flatten(), keras.layers.Dense(1)])
    for sad in (False, True):
        model, ref = fit_against_single_process(build, lambda: keras.optimizers.SGD(0.2), ids, y,
                                                seed=200, sparse_as_dense=sad)
        for i, (g, r) in enumerate(zip(model.get_weights(), ref.get_weights())):
            expect_close(g, r, f"embedding fit sparse_as_dense={sad} weight {i}", rtol=1e-5, atol=1e-6)


class _LogProbe(keras.callbacks.Callback):
    """Records the logs and the weights at the end of every epoch, and the learning
    rate before every batch."""

    def __init__(self):
        super().__init__()
        self.epoch_logs = []
        self.epoch_weights = []
        self.batch_lr = []

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs or {}))
        self.epoch_weights.append([np.array(w) for w in self.model.get_weights()])

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_lr.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


@check
def horovod_keras_module_name_trains_the_same():
    """``import hvdlite.keras as hvd`` (Horovod's ``horovod.keras``) is the Keras module
    under another name: the same objects, ``callbacks`` importable as a submodule, and
    model.fit through its names matches single-process training."""
    import hvdlite.keras as hk
    import hvdlite.keras.callbacks as hkc

    expect(hkc is hvdk.callbacks and hk.callbacks is hvdk.callbacks, "callbacks is another module")
    expect(sorted(hk.__all__) == sorted(hvdk.__all__), "the two modules export different names")
    for name in hvdk.__all__:
        expect(getattr(hk, name) is getattr(hvdk, name), f"hvdlite.keras.{name} is another object")
    x, y = global_data(2, seed=3)
    model = make_model(800 + R)
    init = root_weights(model)
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    ref = fit_both(model, init, lambda: keras.optimizers.SGD(0.05), x, y)
    for i, (g, r) in enumerate(zip(model.get_weights(), ref.get_weights())):
        expect_close(g, r, f"hvdlite.keras fit weight {i} vs single process", rtol=1e-5, atol=1e-6)


@check
def auto_jit_compile_chooses_no_xla_with_distributed_optimizer():
    """Keras 3 resolves compile(jit_compile="auto") to XLA when the machine has a GPU, and
    XLA cannot compile hvdlite's collectives. With a (faked) GPU in the device list, a
    plain optimizer gets XLA, a DistributedOptimizer (also inside a LossScaleOptimizer)
    gets none and model.fit trains as one process does; an explicit jit_compile=True is
    refused with a clear error at the first step, on every rank (one rank communicates
    nothing, so there XLA works)."""
    real_list = tf.config.list_physical_devices
    fake_gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")

    def with_gpu(device_type=None):
        found = real_list(device_type)
        return found + [fake_gpu] if device_type in (None, "GPU") else found

    x, y = global_data(2, seed=6)
    tf.config.list_physical_devices = with_gpu
    try:
        plain = make_model(1)
        plain.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        expect(plain.jit_compile is True,
               f"the faked GPU did not make Keras choose XLA: jit_compile={plain.jit_compile!r}")
        model = make_model(820 + R)
        init = root_weights(model)
        model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
        expect(model.jit_compile is False, f"DistributedOptimizer: jit_compile={model.jit_compile!r}")
        scaled = make_model(1)
        scaled.compile(optimizer=keras.optimizers.LossScaleOptimizer(
            hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05))), loss="mse")
        expect(scaled.jit_compile is False,
               f"LossScaleOptimizer(DistributedOptimizer): jit_compile={scaled.jit_compile!r}")
        forced = make_model(1)
        forced.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse",
                       jit_compile=True)
        expect(forced.jit_compile is True, "an explicit jit_compile=True was overridden")
    finally:
        tf.config.list_physical_devices = real_list
    if N > 1:
        try:
            forced.fit(local_slice(x), local_slice(y), batch_size=B, shuffle=False, verbose=0)
            FAILURES.append("fit with jit_compile=True and DistributedOptimizer did not raise")
        except Exception as e:  # raised while tracing, before any collective: no rank waits
            expect("jit_compile=False" in str(e), f"XLA error message: {str(e)[:300]}")
    else:  # one rank communicates nothing, so XLA has nothing it cannot compile
        forced.fit(local_slice(x), local_slice(y), batch_size=B, shuffle=False, verbose=0)
    ref = fit_both(model, init, lambda: keras.optimizers.SGD(0.05), x, y)
    for i, (g, r) in enumerate(zip(model.get_weights(), ref.get_weights())):
        expect_close(g, r, f"auto-jit fit weight {i} vs single process", rtol=1e-5, atol=1e-6)
    weights_equal_everywhere(model.get_weights(), "auto-jit fit")


@check
def elastic_keras_state_fit_commit_and_restore():
    """hvd.elastic on a fixed world with model.fit, as Horovod's elastic Keras example
    writes it: run() starts every rank from rank 0's weights and attributes, the state
    callbacks keep epoch/batch and commit, the result is single-process training on the
    global batch, and restore() returns to the last commit."""
    x, y = global_data(3, seed=4)  # 3 steps per epoch
    model = make_model(900 + R)  # different weights on every rank until run() syncs them
    init = root_weights(model)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss="mse")
    state = hvdk.elastic.KerasState(model, batch=0, epoch=0 if R == 0 else 5)
    commits = []
    state.check_host_updates = lambda: commits.append(state.batch)  # called by every commit
    callbacks = [hvdk.elastic.UpdateEpochStateCallback(state),
                 hvdk.elastic.UpdateBatchStateCallback(state),
                 hvdk.elastic.CommitStateCallback(state, batches_per_commit=2)]
    epochs = 2

    @hvdk.elastic.run
    def train(state):
        expect(state.epoch == 0, f"epoch after sync: {state.epoch}")
        state.model.fit(local_slice(x), local_slice(y), batch_size=B, shuffle=False, verbose=0,
                        epochs=epochs - state.epoch, callbacks=callbacks)
        return "trained"

    expect(train(state) == "trained", "run() did not return the function's result")
    expect((state.epoch, state.batch) == (2, 0), f"epoch/batch after fit: {state.epoch}, {state.batch}")
    # Every 2 batches (counted across epochs) and at each epoch's end: after batches
    # 1 and 2 of epoch 0 (batch index 1), its end, batches 0 and 2 of epoch 1, its end.
    expect(commits == [1, 0, 0, 2, 0], f"commits at batches {commits}")
    ref = make_model(1)
    ref.set_weights(init)
    ref.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    ref.fit(x, y, batch_size=B * N, shuffle=False, verbose=0, epochs=epochs)
    for i, (g, r) in enumerate(zip(model.get_weights(), ref.get_weights())):
        expect_close(g, r, f"elastic fit weight {i} vs single process", rtol=1e-5, atol=1e-6)
    weights_equal_everywhere(model.get_weights(), "elastic fit")
    # restore() undoes what came after the last commit: weights, optimizer slots, attributes.
    committed = [np.array(v) for v in model.weights]
    slots = [np.array(v) for v in model.optimizer.variables]
    for v in model.weights:
        v.assign(v + 1.0)
    for v in model.optimizer.variables:
        if str(v.dtype).startswith("float"):
            v.assign(v + 1.0)
    state.epoch = 77
    state.restore()
    for i, (v, c) in enumerate(zip(model.weights, committed)):
        expect_close(np.array(v), c, f"restored weight {i}")
    for i, (v, c) in enumerate(zip(model.optimizer.variables, slots)):
        expect_close(np.array(v), c, f"restored optimizer variable {i} ({v.path})")
    expect(state.epoch == 2, f"restored epoch {state.epoch}")
    # The TensorFlow module's state over plain tf.Variables.
    a = tf.Variable(np.full(3, float(R), np.float32))
    b = tf.Variable(float(10 + R))
    tf_state = hvd.elastic.TensorFlowState([a, b], step=R)

    @hvd.elastic.run
    def check_synced(s):
        return [a.numpy().tolist(), float(b.numpy()), s.step]

    expect(check_synced(tf_state) == [[0.0] * 3, 10.0, 0], f"after sync: {check_synced(tf_state)}")
    a.assign([5.0, 5.0, 5.0])
    tf_state.step = 3
    tf_state.commit()
    a.assign([9.0, 9.0, 9.0])
    tf_state.step = 4
    tf_state.restore()
    expect(a.numpy().tolist() == [5.0] * 3 and tf_state.step == 3,
           f"TensorFlowState restore: {a.numpy()}, step {tf_state.step}")
    for bad in (dict(variables=None), dict(variables=[a], session=object())):
        try:
            hvd.elastic.TensorFlowState(**bad)
            FAILURES.append(f"TensorFlowState({bad}) was accepted")
        except ValueError:
            pass


@check
def metric_average_callback_averages_logs():
    x, y = global_data(2, seed=1)
    model = make_model(300)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse",
                  metrics=["mae"])
    before, after = _LogProbe(), _LogProbe()
    model.fit(local_slice(x), local_slice(y), batch_size=B, epochs=2, shuffle=False, verbose=0,
              validation_data=(local_slice(x), local_slice(y)),
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0), before,
                         hvdk.callbacks.MetricAverageCallback(), after])
    for epoch in range(2):
        for key in ("loss", "mae", "val_loss", "val_mae"):
            local = before.epoch_logs[epoch][key]
            everyone = hvd.allgather_object(local)
            expect_close(after.epoch_logs[epoch][key], np.mean(everyone), f"averaged {key} epoch {epoch}",
                         rtol=1e-6)
            if N > 1 and epoch == 0 and key == "loss":
                expect(len(set(everyone)) > 1, "local losses should differ between ranks")


@check
def broadcast_callback_leaves_local_variables_alone():
    """BroadcastGlobalVariablesCallback(local_variables=...) and register_local_var: the
    other variables take rank 0's values, the local ones keep each rank's own; bad
    input is refused; broadcast_global_variables names what to use in TensorFlow 2."""
    model = make_model(700 + R)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    first_kernel, second_kernel = model.layers[0].kernel, model.layers[1].kernel
    own = [np.array(v) for v in model.get_weights()]
    cb = hvdk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=first_kernel)
    cb.register_local_var(second_kernel.value)  # the tf.Variable under the Keras one
    cb.set_model(model)
    cb.on_train_begin()
    expect(cb.broadcast_done, "the callback did not broadcast a built model at train begin")
    root = hvd.broadcast_object(own, root_rank=0)
    local = {id(first_kernel), id(second_kernel)}
    for i, (v, mine, root_w) in enumerate(zip(model.weights, own, root)):
        want = mine if id(v) in local else root_w
        expect_close(np.array(v), want, f"weight {i} ({v.path}) after the broadcast")
    if R > 0:
        expect(not np.allclose(own[0], root[0]), "the ranks' kernels should differ to begin with")
    for bad in ([np.zeros(3)], ["kernel"]):
        try:
            hvdk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=bad)
            FAILURES.append(f"local_variables={bad!r} was accepted")
        except ValueError as e:
            expect("tf.Variable or keras.Variable" in str(e), f"local_variables error: {e}")
    for module in (hvd, hvdk):
        try:
            module.broadcast_global_variables(0)
            FAILURES.append(f"{module.__name__}.broadcast_global_variables did not raise")
        except RuntimeError as e:
            expect("broadcast_variables" in str(e) and "BroadcastGlobalVariablesCallback" in str(e),
                   f"broadcast_global_variables message: {e}")
    expect_close(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum), [float(N)], "allreduce afterwards")


@check
def best_model_checkpoint_saves_the_best_epoch_on_rank_0():
    """BestModelCheckpoint (Horovod's name, monitor first): rank 0 alone writes, and the
    file holds the weights of the epoch with the best (rank-averaged) val_loss; a
    missing or wrongly suffixed path fails on every rank before training."""
    epochs = 6
    x, y = global_data(2, seed=7)
    xv, yv = global_data(1, seed=8)
    model = make_model(800 + R)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.6, momentum=0.9)),
                  loss="mse")
    folder = hvd.broadcast_object(tempfile.mkdtemp(prefix="hvdlite_best_") if R == 0 else None,
                                  root_rank=0)
    path = os.path.join(folder, f"best_rank{R}.keras")
    probe = _LogProbe()
    best = hvdk.callbacks.BestModelCheckpoint("val_loss", filepath=path)
    model.fit(local_slice(x), local_slice(y), batch_size=B, epochs=epochs, shuffle=False,
              verbose=0, validation_data=(local_slice(xv), local_slice(yv)),
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvdk.callbacks.MetricAverageCallback(), best, probe])
    hvd.barrier()
    written = sorted(os.listdir(folder))
    expect(written == ["best_rank0.keras"], f"files written: {written}")
    losses = [logs["val_loss"] for logs in probe.epoch_logs]
    everyone = hvd.allgather_object(losses)
    expect(all(np.allclose(l, losses) for l in everyone), "averaged val_loss differs between ranks")
    if R == 0:
        saved = keras.models.load_model(path).get_weights()
        at = int(np.argmin(losses))
        for i, (a, b) in enumerate(zip(saved, probe.epoch_weights[at])):
            expect_close(a, b, f"saved weight {i} vs epoch {at + 1} of {losses}")
        expect(best.best is not None and abs(float(best.best) - losses[at]) < 1e-9,
               f"best {best.best} vs {losses[at]}")
    for later_path, message in ((None, "no file path"),
                                (os.path.join(folder, "w.keras"), ".weights.h5")):
        # Keras checks a path given up front; this one is set after construction.
        cb = hvdk.callbacks.BestModelCheckpoint(save_weights_only=True)
        cb.filepath = later_path
        try:
            model.fit(local_slice(x), local_slice(y), batch_size=B, epochs=1, verbose=0, callbacks=[cb])
            FAILURES.append(f"BestModelCheckpoint with filepath {later_path!r} did not fail")
        except ValueError as e:
            expect(message in str(e), f"BestModelCheckpoint error: {e}")
    model.fit(local_slice(x), local_slice(y), batch_size=B, epochs=1, verbose=0)  # still usable
    weights_equal_everywhere(model.get_weights(), "after the failed fits")
    hvd.barrier()
    if R == 0:
        shutil.rmtree(folder)


@check
def warmup_callback_learning_rates_and_momentum_correction():
    """LearningRateWarmupCallback: the rate before every batch follows Horovod's formula,
    and SGD with momentum (corrected) gives the weights of a hand-written reference."""
    steps_per_epoch, epochs, warmup = 3, 3, 2
    x, y = global_data(steps_per_epoch, seed=2, outputs=1)  # the same batches every epoch
    base_lr, momentum = 0.05, 0.9
    keras.utils.set_random_seed(400)
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1)])
    init = root_weights(model)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(base_lr, momentum=momentum)),
                  loss="mse")
    probe = _LogProbe()
    model.fit(local_slice(x), local_slice(y), batch_size=B, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvdk.callbacks.LearningRateWarmupCallback(initial_lr=base_lr, warmup_epochs=warmup),
                         probe])
    expected_lr = []
    for e in range(epochs):
        for b in range(steps_per_epoch):
            if e < warmup:
                ep = e + b / steps_per_epoch + 1 / steps_per_epoch
                expected_lr.append(base_lr / N * (ep * (N - 1) / warmup + 1))
            else:
                expected_lr.append(expected_lr[-1])
    expect_close(probe.batch_lr, expected_lr, "warm-up learning rates", rtol=1e-6)
    expect_close(expected_lr[warmup * steps_per_epoch - 1], base_lr, "rate at the end of warm-up")
    expect_close(probe.epoch_logs[-1]["lr"], base_lr, "logs['lr']", rtol=1e-6)
    # reference: SGD with momentum on the global batches, buffer scaled when the rate changes
    w = tf.Variable(init[0])
    bias = tf.Variable(init[1])
    mw, mb = np.zeros_like(init[0]), np.zeros_like(init[1])
    prev = base_lr
    for t, lr in enumerate(expected_lr):
        if lr != prev:
            mw, mb = mw * (lr / prev), mb * (lr / prev)
            prev = lr
        k = t % steps_per_epoch
        xb, yb = x[k * B * N:(k + 1) * B * N], y[k * B * N:(k + 1) * B * N]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(xb, w) + bias - yb) ** 2)
        gw, gb = tape.gradient(loss, [w, bias])
        lr32 = np.float32(lr)
        mw = np.float32(momentum) * mw - gw.numpy() * lr32
        mb = np.float32(momentum) * mb - gb.numpy() * lr32
        w.assign_add(mw)
        bias.assign_add(mb)
    expect_close(model.get_weights()[0], w.numpy(), "warm-up + momentum correction weights", rtol=1e-4, atol=1e-5)
    expect_close(model.get_weights()[1], bias.numpy(), "warm-up + momentum correction bias", rtol=1e-4, atol=1e-5)


@check
def schedule_callback_rmsprop_momentum_correction():
    """Momentum correction also scales RMSprop's momentum buffers (Keras 3 keeps them in
    ``_momentums``): fit with a per-batch schedule equals a hand-written RMSprop whose
    buffer is scaled by new/old rate whenever the rate changes, as for SGD."""
    steps_per_epoch, epochs = 3, 2
    x, y = global_data(steps_per_epoch, seed=6, outputs=1)
    base_lr, momentum, rho, eps = 0.05, 0.9, 0.9, 1e-7
    keras.utils.set_random_seed(450)
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1)])
    init = root_weights(model)
    model.compile(optimizer=hvdk.DistributedOptimizer(
        keras.optimizers.RMSprop(base_lr, rho=rho, momentum=momentum, epsilon=eps)), loss="mse")
    probe = _LogProbe()
    model.fit(local_slice(x), local_slice(y), batch_size=B, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvdk.callbacks.LearningRateScheduleCallback(
                             initial_lr=base_lr, multiplier=0.5, staircase=False,
                             steps_per_epoch=steps_per_epoch),
                         probe])
    expected_lr = [base_lr * 0.5 ** (e + b / steps_per_epoch)
                   for e in range(epochs) for b in range(steps_per_epoch)]
    expect_close(probe.batch_lr, expected_lr, "RMSprop schedule rates", rtol=1e-6)

    def reference(corrected):
        w, bias = tf.Variable(init[0]), tf.Variable(init[1])
        v = [np.zeros_like(init[0]), np.zeros_like(init[1])]
        m = [np.zeros_like(init[0]), np.zeros_like(init[1])]
        prev = base_lr
        for t, lr in enumerate(expected_lr):
            if corrected and lr != prev:
                m = [mi * np.float32(lr / prev) for mi in m]
            prev = lr
            k = t % steps_per_epoch
            xb, yb = x[k * B * N:(k + 1) * B * N], y[k * B * N:(k + 1) * B * N]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((tf.matmul(xb, w) + bias - yb) ** 2)
            grads = [g.numpy() for g in tape.gradient(loss, [w, bias])]
            for i, (var, g) in enumerate(zip((w, bias), grads)):
                v[i] = np.float32(rho) * v[i] + np.float32(1 - rho) * g * g
                m[i] = np.float32(momentum) * m[i] + np.float32(lr) * g / np.sqrt(v[i] + np.float32(eps))
                var.assign_sub(m[i])
        return [w.numpy(), bias.numpy()]

    want, uncorrected = reference(True), reference(False)
    expect(not np.allclose(want[0], uncorrected[0], rtol=1e-3, atol=1e-5),
           "the reference does not depend on the correction; the check would prove nothing")
    for i, (g, r) in enumerate(zip(model.get_weights(), want)):
        expect_close(g, r, f"RMSprop momentum-corrected weight {i}", rtol=1e-4, atol=1e-5)


@check
def schedule_callback_staircase():
    steps_per_epoch, epochs = 2, 4
    x, y = global_data(steps_per_epoch, seed=3)
    model = make_model(500)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    probe = _LogProbe()
    model.fit(local_slice(x), local_slice(y), batch_size=B, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvdk.LearningRateScheduleCallback(initial_lr=0.08, multiplier=0.5, start_epoch=1,
                                                           end_epoch=3), probe])
    # a constant multiplier m gives initial_lr * m ** (epoch - start_epoch), as in Horovod
    want = [0.1] * 2 + [0.08] * 2 + [0.04] * 4
    expect_close(probe.batch_lr, want, "staircase schedule", rtol=1e-6)
    late = hvdk.LearningRateScheduleCallback(initial_lr=1.0, multiplier=0.1, start_epoch=30)
    expect_close(late.multiplier(30), 1.0, "constant multiplier at start_epoch=30")
    expect_close(late.multiplier(32), 0.01, "constant multiplier two epochs after start_epoch")
    smooth = hvdk.LearningRateScheduleCallback(initial_lr=1.0, multiplier=0.25, start_epoch=2,
                                               staircase=False, steps_per_epoch=2)
    expect_close(smooth.multiplier(2.5), 0.5, "non-staircase constant multiplier at epoch 2.5")
    fn = hvdk.LearningRateScheduleCallback(initial_lr=1.0, multiplier=lambda e: 1.0 / (1 + e),
                                           staircase=False, steps_per_epoch=4)
    expect_close(fn.multiplier(1.5), 0.4, "callable multiplier")


@check
def load_model_wraps_restored_optimizer():
    steps = 2
    x, y = global_data(2 * steps, seed=4)
    first, second = x[:steps * B * N], x[steps * B * N:]
    yfirst, ysecond = y[:steps * B * N], y[steps * B * N:]
    model = make_model(600 + R)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.Adam(0.02)), loss="mse")
    model.fit(local_slice(first), local_slice(yfirst), batch_size=B, shuffle=False, verbose=0,
              callbacks=[hvdk.BroadcastGlobalVariablesCallback(0)])
    path = hvd.broadcast_object(os.path.join(tempfile.mkdtemp(prefix="hvdlite_tf_"), "model.keras")
                                if R == 0 else None, root_rank=0)
    if R == 0:
        model.save(path)
    hvd.barrier()
    loaded = hvdk.load_model(path)
    opt = loaded.optimizer
    expect(isinstance(opt, keras.optimizers.Adam) and hasattr(opt, "_hvd_options"),
           f"restored optimizer not wrapped: {type(opt).__mro__[:3]}")
    expect(int(opt.iterations.numpy()) == steps, f"restored iterations {int(opt.iterations.numpy())}")
    for i, (a, b) in enumerate(zip(loaded.get_weights(), model.get_weights())):
        expect_close(a, b, f"restored weight {i}")
    loaded.fit(local_slice(second), local_slice(ysecond), batch_size=B, shuffle=False, verbose=0)
    ref = keras.models.load_model(path)  # plain Keras reads the file too
    expect(not hasattr(ref.optimizer, "_hvd_options"), "plain load_model should give a plain optimizer")
    ref.fit(second, ysecond, batch_size=B * N, shuffle=False, verbose=0)
    for i, (a, b) in enumerate(zip(loaded.get_weights(), ref.get_weights())):
        expect_close(a, b, f"continued training weight {i} vs single process", rtol=1e-5, atol=1e-6)
    weights_equal_everywhere(loaded.get_weights(), "after load_model")


@check
def backward_passes_per_step_accumulates():
    passes, updates, lr = 2, 2, 0.1
    steps = passes * updates
    x, y = global_data(steps, seed=5)
    model = make_model(700 + R)
    init = root_weights(model)
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(lr), backward_passes_per_step=passes,
                                    average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse")
    model.fit(local_slice(x), local_slice(y), batch_size=B, shuffle=False, verbose=0,
              callbacks=[hvdk.BroadcastGlobalVariablesCallback(0)])
    expect(int(opt.iterations.numpy()) == updates, f"applied updates {int(opt.iterations.numpy())}")
    ref = make_model(1)
    ref.set_weights(init)
    variables = ref.trainable_variables
    for u in range(updates):
        total = [tf.zeros_like(v) for v in variables]
        for p in range(passes):
            t = u * passes + p
            xb, yb = x[t * B * N:(t + 1) * B * N], y[t * B * N:(t + 1) * B * N]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((ref(xb) - yb) ** 2)
            total = [a + g for a, g in zip(total, tape.gradient(loss, variables))]
        for v, g in zip(variables, total):
            v.assign_sub(lr * g / passes)
    for i, (a, b) in enumerate(zip(model.get_weights(), ref.get_weights())):
        expect_close(a, b, f"backward_passes_per_step weight {i}", rtol=1e-5, atol=1e-6)
    weights_equal_everywhere(model.get_weights(), "backward_passes_per_step")


@check
def distributed_optimizer_keeps_state_of_built_optimizer():
    model = make_model(800)
    plain = keras.optimizers.Adam(0.01)
    plain.build(model.trainable_variables)
    plain.iterations.assign(5)
    wrapped = hvdk.DistributedOptimizer(plain, name="renamed")
    expect(wrapped.built and int(wrapped.iterations.numpy()) == 5, "state of a built optimizer was lost")
    expect(wrapped.name == "renamed" and type(wrapped).__name__ == "Adam", f"name {wrapped.name}")
    expect(wrapped.get_config()["learning_rate"] == plain.get_config()["learning_rate"], "config differs")
    try:
        hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Sum, gradient_predivide_factor=2.0)
        FAILURES.append("predivide with op=Sum should raise")
    except ValueError:
        pass


@check
def distributed_optimizer_rejects_unsupported_ops():
    """An unknown op is refused when the optimizer is wrapped, naming it, rather than at
    the first training step; Max and Adasum are accepted."""
    try:
        hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), op=17)
        FAILURES.append("DistributedOptimizer(op=17) did not raise")
    except ValueError as e:
        expect("17" in str(e), f"op=17 error message does not name it: {e}")
    for op in (hvdk.Max, hvdk.Adasum):
        opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), op=op)
        expect(opt._hvd_options["op"] == op, f"op={op} should be accepted")


@check
def distributed_optimizer_keeps_weight_decay_exclusions():
    """State that get_config does not record survives wrapping: AdamW with the biases
    excluded from weight decay leaves them decay-free, exactly as the unwrapped AdamW
    does in one process; a from_config copy of the wrapped optimizer still trains."""
    x, y = global_data(1, seed=7)  # the same batch on every rank: averaging changes nothing

    def train(make_opt, steps=3):
        model = make_model(900)
        opt = make_opt(model)
        for _ in range(steps):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
        return model.get_weights(), opt

    def adamw(exclude):
        o = keras.optimizers.AdamW(0.05, weight_decay=0.5)
        if exclude:
            o.exclude_from_weight_decay(var_names=["bias"])
        return o

    plain, _ = train(lambda m: adamw(True))
    decayed, _ = train(lambda m: adamw(False))
    wrapped, opt = train(lambda m: hvdk.DistributedOptimizer(adamw(True)))
    expect(getattr(opt, "_exclude_from_weight_decay_pattern", None) is not None,
           "the wrapped AdamW lost exclude_from_weight_decay(var_names=['bias'])")
    expect(not np.allclose(plain[1], decayed[1], rtol=1e-4, atol=1e-6),
           "excluding the bias should change it; the check would prove nothing")
    for i, (g, r) in enumerate(zip(wrapped, plain)):
        expect_close(g, r, f"wrapped AdamW with bias excluded, weight {i}", rtol=1e-6, atol=1e-7)
    # the same with exclusion by variable list, and for an optimizer wrapped after build
    def by_list(m):
        o = keras.optimizers.AdamW(0.05, weight_decay=0.5)
        o.exclude_from_weight_decay(var_list=[v for v in m.trainable_variables if "bias" in v.name])
        o.build(m.trainable_variables)
        return hvdk.DistributedOptimizer(o)
    listed, _ = train(by_list)
    for i, (g, r) in enumerate(zip(listed, plain)):
        expect_close(g, r, f"wrapped built AdamW with var_list exclusion, weight {i}", rtol=1e-6, atol=1e-7)
    # an instance of the wrapped class made from its config has default options
    copy = type(opt).from_config(opt.get_config())
    expect(copy._hvd_options["op"] == hvdk.Average, "from_config copy should average by default")
    copied, _ = train(lambda m: type(opt).from_config(adamw(False).get_config()))
    for i, (g, r) in enumerate(zip(copied, decayed)):
        expect_close(g, r, f"from_config copy of the wrapped class, weight {i}", rtol=1e-6, atol=1e-7)


@check
def local_variables_of_distributed_optimizer():
    """register_local_var and PartialDistributedOptimizer(local_layers=...) under
    model.fit: local weights move by this rank's gradient divided by the number of ranks
    (by the gradient itself with scale_local_gradients=False); the others by the average."""
    lr = 0.1
    x, y = global_data(1, seed=9)
    xl, yl = local_slice(x), local_slice(y)
    for variant in ("partial", "register", "register_unscaled"):
        model = make_model(3)  # the same initial weights on every rank
        init = [w.copy() for w in model.get_weights()]
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(yl, model(xl))
        mine = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
        mean = [np.mean(gs, axis=0) for gs in zip(*hvd.allgather_object(mine))]
        first = model.layers[0]
        if variant == "partial":
            opt = hvdk.PartialDistributedOptimizer(keras.optimizers.SGD(lr), local_layers=first)
        else:
            opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(lr),
                                            scale_local_gradients=variant == "register")
            for w in first.trainable_weights:
                opt.register_local_var(w)
        model.compile(optimizer=opt, loss="mse")
        model.fit(xl, yl, batch_size=B, epochs=1, shuffle=False, verbose=0)
        div = 1 if variant == "register_unscaled" else N
        n_first = len(first.trainable_weights)
        for i, (got, w0) in enumerate(zip(model.get_weights(), init)):
            step = mine[i] / div if i < n_first else mean[i]
            expect_close(got, w0 - lr * step, f"{variant}: weight {i}", rtol=1e-5, atol=1e-6)
        weights_equal_everywhere(model.get_weights()[n_first:], f"{variant}: shared weights")


@check
def backward_passes_per_step_builds_the_optimizer():
    """backward_passes_per_step > 1 with an optimizer that is first built by its first
    update (no BroadcastGlobalVariablesCallback to build it), in a compiled and in an
    eager fit: every update is the average of the summed local gradients."""
    passes, lr = 2, 0.1
    x, y = global_data(passes, seed=11)
    for run_eagerly in (False, True):
        model = make_model(4)  # the same initial weights on every rank
        init = [w.copy() for w in model.get_weights()]
        opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(lr), backward_passes_per_step=passes)
        model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
        model.fit(local_slice(x), local_slice(y), batch_size=B, shuffle=False, verbose=0)
        expect(int(opt.iterations.numpy()) == 1, f"eager={run_eagerly}: applied updates "
                                                 f"{int(opt.iterations.numpy())}")
        ref = make_model(4)
        ref.set_weights(init)
        total = [np.zeros_like(w) for w in init]
        for t in range(passes):
            xb, yb = x[t * B * N:(t + 1) * B * N], y[t * B * N:(t + 1) * B * N]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((ref(xb) - yb) ** 2)
            total = [a + g.numpy() for a, g in zip(total, tape.gradient(loss, ref.trainable_variables))]
        for i, (got, w0, g) in enumerate(zip(model.get_weights(), init, total)):
            expect_close(got, w0 - lr * g, f"eager={run_eagerly}: weight {i}", rtol=1e-5, atol=1e-6)


def make_bn_model(seed, norm):
    """Conv -> batch norm (4-D, channels last) -> Dense -> batch norm (2-D) -> Dense."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((4, 4, 2)),
        keras.layers.Conv2D(3, 3, padding="same"),
        norm(momentum=0.8),
        keras.layers.ReLU(),
        keras.layers.Flatten(),
        keras.layers.Dense(H),
        norm(momentum=0.8, center=False),
        keras.layers.Activation("tanh"),
        keras.layers.Dense(2)])


def bn_statistics(model):
    return [w.numpy() for layer in model.layers
            if isinstance(layer, keras.layers.BatchNormalization)
            for w in (layer.moving_mean, layer.moving_variance)]


@check
def sync_batch_normalization_matches_global_batch():
    """hvd.SyncBatchNormalization against keras.layers.BatchNormalization in one process
    on the global batch. Ranks hold batches of different sizes (rank 1 an empty one).
    Checked: the training-mode output and the gradient reaching each rank's own inputs
    (which depends on the other ranks' inputs through the shared statistics), eagerly
    and in tf.function, also with a Keras mask; then three SGD steps of a custom loop
    (DistributedGradientTape with op=Sum on a loss divided by the global row count):
    weights and moving statistics.

    The loop's batches are uneven but not empty: with oneDNN on (TensorFlow's default on
    CPUs with AVX-512 VNNI or BF16), TensorFlow 2.21's Conv2D returns a tensor shaped like
    its input for an empty batch, and a plain single-process Conv2D + BatchNormalization
    model fails on it too."""
    rows = [(3 + 2 * r) % 5 for r in range(N)]  # 3, 0, 2, 4
    total = sum(rows)
    mine = slice(sum(rows[:R]), sum(rows[:R + 1]))  # this rank's rows of the global batch
    expect(isinstance(hvd.SyncBatchNormalization(), keras.layers.BatchNormalization)
           and hvdk.SyncBatchNormalization is hvd.SyncBatchNormalization, "exports")

    # Output and input gradient of the layer alone, 4-D and masked 3-D inputs.
    rng = np.random.default_rng(42)
    xg = (rng.normal(size=(total, 3, 3, 4)) * 3 + 5).astype(np.float32)
    cg = rng.normal(size=xg.shape).astype(np.float32)
    seq = rng.normal(size=(total, 5, 4)).astype(np.float32)
    seq[:, 3:][rng.random(size=(total, 2)) < 0.5] = 0.0  # masked time steps
    cseq = rng.normal(size=seq.shape).astype(np.float32)

    def out_and_grad(layer, x, c, masking):
        x = tf.convert_to_tensor(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            mask = tf.reduce_any(tf.not_equal(x, 0.0), axis=-1) if masking else None
            y = layer(x, training=True, mask=mask)
            loss = tf.reduce_sum(y * c)
        return y, tape.gradient(loss, x)

    for what, xs, cs, masking in (("4-D", xg, cg, False), ("masked 3-D", seq, cseq, True)):
        keras.utils.set_random_seed(5)  # the same gamma and beta on every rank
        ref = keras.layers.BatchNormalization(gamma_initializer="random_normal",
                                              beta_initializer="random_normal")
        ref.build(xs.shape)
        ref_init = ref.get_weights()
        want_y, want_g = out_and_grad(ref, xs, cs, masking)
        for mode in ("eager", "tf.function"):
            layer = hvd.SyncBatchNormalization(gamma_initializer="random_normal",
                                               beta_initializer="random_normal")
            layer.build(xs.shape)
            layer.set_weights(ref_init)
            fn = out_and_grad if mode == "eager" else tf.function(out_and_grad)
            y, g = fn(layer, xs[mine], cs[mine], masking)
            expect_close(y, want_y[mine], f"{what} {mode}: output", rtol=1e-4, atol=1e-4)
            expect_close(g, want_g[mine], f"{what} {mode}: input gradient", rtol=1e-4, atol=1e-4)
            if not masking:
                expect_close(layer.moving_mean.numpy(), 0.01 * np.mean(xg, axis=(0, 1, 2)),
                             f"{mode}: moving mean", rtol=1e-4, atol=1e-5)
                expect_close(layer.moving_variance.numpy(),
                             0.99 + 0.01 * np.var(xg.astype(np.float64), axis=(0, 1, 2)),
                             f"{mode}: moving variance", rtol=1e-4, atol=1e-5)

    # A custom training loop on uneven batches (3, 1, 2, 4 rows; see the docstring).
    rows = [(3 + 2 * r) % 5 or 1 for r in range(N)]
    total = sum(rows)
    mine = slice(sum(rows[:R]), sum(rows[:R + 1]))
    steps, lr = 3, 0.1
    x = rng.normal(size=(steps, total, 4, 4, 2)).astype(np.float32)
    y = rng.normal(size=(steps, total, 2)).astype(np.float32)
    model = make_bn_model(900 + R, hvd.SyncBatchNormalization)
    init = root_weights(model)
    model.set_weights(init)
    opt = keras.optimizers.SGD(lr, momentum=0.9)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((model(xb, training=True) - yb) ** 2) / total
        tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for t in range(steps):
        step(x[t, mine], y[t, mine])
    ref = make_bn_model(1, keras.layers.BatchNormalization)
    ref.set_weights(init)
    ref_opt = keras.optimizers.SGD(lr, momentum=0.9)
    for t in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((ref(x[t], training=True) - y[t]) ** 2) / total
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables),
                                    ref.trainable_variables))
    for i, (a, b) in enumerate(zip(model.get_weights(), ref.get_weights())):
        expect_close(a, b, f"custom loop: weight {i}", rtol=1e-4, atol=1e-5)
    weights_equal_everywhere(model.get_weights(), "SyncBatchNormalization custom loop")

    # An empty global batch is an error on every rank, and hvdlite stays usable.
    if N > 1:
        layer = hvd.SyncBatchNormalization()
        for mode, call in (("eager", layer), ("tf.function", tf.function(layer))):
            try:
                call(tf.zeros((0, 3)), training=True)
                FAILURES.append(f"{mode}: an empty global batch did not raise")
            except tf.errors.InvalidArgumentError as e:
                expect("global batch is empty" in str(e), f"{mode}: message {str(e)[:300]}")
        got = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)
        expect(float(got[0]) == N, f"allreduce after the error gave {got}")


@check
def sync_batch_normalization_fit_matches_global_batch():
    """model.fit with DistributedOptimizer and hvd.SyncBatchNormalization layers equals
    one process with keras.layers.BatchNormalization on the global batch, moving
    statistics included; the model saves and loads with the layer."""
    steps = 3
    rng = np.random.default_rng(7)
    x = (rng.normal(size=(steps * B * N, 4, 4, 2)) + 1).astype(np.float32)
    y = rng.normal(size=(steps * B * N, 2)).astype(np.float32)
    model, ref = fit_against_single_process(
        lambda seed: make_bn_model(seed, hvdk.SyncBatchNormalization),
        lambda: keras.optimizers.SGD(0.1, momentum=0.9), x, y, seed=1000,
        build_reference=lambda seed: make_bn_model(seed, keras.layers.BatchNormalization))
    for i, (g, r) in enumerate(zip(model.get_weights(), ref.get_weights())):
        expect_close(g, r, f"fit weight {i} vs single process", rtol=1e-4, atol=1e-5)
    for i, (g, r) in enumerate(zip(bn_statistics(model), bn_statistics(ref))):
        expect_close(g, r, f"fit moving statistic {i}", rtol=1e-4, atol=1e-5)
    weights_equal_everywhere(model.get_weights(), "SyncBatchNormalization fit")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.keras")
        model.save(path)
        loaded = keras.models.load_model(path)
    kinds = [type(layer).__name__ for layer in loaded.layers]
    expect(kinds.count("SyncBatchNormalization") == 2, f"loaded layers {kinds}")
    expect_close(loaded.predict(x[:B], verbose=0), model.predict(x[:B], verbose=0),
                 "loaded model's inference", rtol=1e-6, atol=1e-6)
