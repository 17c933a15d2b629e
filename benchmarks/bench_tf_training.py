"""TensorFlow/Keras training throughput: single process vs hvdlite vs MultiWorkerMirroredStrategy.

    python benchmarks/bench_tf_training.py [--quick] [--models mlp,resnet] [--apis loop,fit]
                                           [--modes M,...] [--rounds R] [--json-out F.json]
                                           [--backward-idle-ms X] [--ranks R]
                                           [--hosts N [--rate 1gbit]] [--results PATH]

Run it with plain ``python`` (not under mpirun): it starts every configuration itself,
each in fresh processes with one TensorFlow intra-op and one inter-op thread:

* ``single``: one process, plain Keras optimizer;
* ``single_tuned``: the same, with the glibc malloc settings that hvdlite's engine makes
  in its own processes (``MALLOC_*_`` variables, values of ``TuneHostAllocator`` in
  ``hvdlite/csrc/engine/engine.cc``). A control: plain TensorFlow gives memory back to the
  kernel and faults it in again every step, which those settings stop. Efficiency
  against it is what communication alone costs;
* ``hvdlite``: 2 ranks started by ``hvdlite-run`` (``python -m hvdlite.runner``; plain
  ``mpirun`` if that is missing): ``hvd.DistributedGradientTape`` in the custom loop,
  ``hvd.DistributedOptimizer`` with ``model.fit``;
* ``independent``: 2 ``single_tuned`` processes at once, each on its own batch, with no
  communication: the ceiling of what 2 ranks sharing this machine can reach (they start
  each timed run together; their throughputs add up);
* ``lockstep``: 2 ranks started like ``hvdlite``, each training on its own batch with a
  plain optimizer, but kept in step: between the backward pass and the update, the
  ranks allreduce one float. Everything of ``hvdlite`` but moving the gradients: the
  ceiling of synchronous data-parallel training on this machine, where the ranks'
  memory-bound phases (the optimizer update) always run at the same time;
  After its timed steps, each ``lockstep`` run also times hvdlite allreducing arrays of
  the model's gradient shapes alone (``allreduce_ms``, the median of 15 calls that each
  start together on every rank): moving the gradients once at the engine's speed, with
  nothing else running. ``lockstep + allreduce``, lockstep's step made that much longer,
  is what synchronous training can reach when the gradients' allreduce cannot overlap
  computation (as with one core per rank, where it needs the cores the backward pass
  uses);
* ``hvdlite_overlap``: ``hvdlite`` with ``HVDLITE_TF_OVERLAP=1``, gradients submitted in
  buckets while the backward pass runs (``hvdlite/tensorflow/overlap.py``), which the
  default leaves off with a single inter-op thread;
* ``hvdlite_pyfunc`` (not in the default list): ``hvdlite`` with ``HVDLITE_TF_KERNEL=0``,
  collectives inside graphs as blocking ``tf.py_function`` ops, hvdlite's fallback where
  its asynchronous graph ops (``hvdlite/tensorflow/_kernels.py``) cannot be built, for
  comparing the two side by side (``hvdlite/pyfunc`` in the table);
* ``mwms``: TensorFlow's own ``tf.distribute.MultiWorkerMirroredStrategy`` on 2 worker
  processes joined over loopback (``TF_CONFIG`` with localhost ports), ring collectives.

``--hosts N`` (root only) spreads the ranks of the configurations that communicate
(``hvdlite``, ``lockstep``, ``hvdlite_overlap``, ``mwms``) over N hosts emulated on this
machine (``tests/hosts/emulated.py``: network namespaces on a bridge, each host's link
limited to ``--rate`` both ways), ``--ranks`` / N on each, filled in host order: hvdlite's
through ``hvdlite-run -H h1:k,h2:k``, MWMS's workers each started inside its host's
namespace with ``TF_CONFIG`` naming the hosts' addresses. ``single``, ``single_tuned``
and ``independent`` have no communication and stay on this host; every "host" still
shares this machine's cores.

Two APIs for each: ``loop``, a custom ``tf.function`` training step, and ``fit``, Keras
``model.fit`` (one synthetic batch repeated). Models (defined in
``examples/tensorflow2/tensorflow2_synthetic_benchmark.py``), rebuilt in Keras from the
PyTorch benchmark's: ``mlp``, 20 Dense+ReLU layers 1024 -> 700 (x19) -> 10, 9.56 M parameters,
batch 64 per rank (communication-heavy); ``resnet``, a ResNet-like CNN on 32x32 images,
3 stages of 2 basic blocks (64/128/256), 2.78 M parameters, batch 32 per rank
(compute-heavy). Optimizer SGD(0.01, momentum 0.9), softmax cross-entropy.
``--backward-idle-ms X`` (MLP only) makes every layer's gradient also sleep X ms, leaving
the CPU idle as while an accelerator computes: the case in which a rank has a core for
communication during the backward pass, so ``hvdlite_overlap`` can hide it.

Before timing, every distributed configuration takes one SGD step on the MLP from a
common starting point, each rank on its own half of a global batch, and its weights are
compared with the single process's step on the whole global batch (Keras 3 losses
inside a strategy already divide by the number of replicas, so the MWMS loop must not
divide again). The benchmark refuses to time a configuration that fails this check.

Timing: ``--warmup`` steps, then ``--windows`` windows of ``--steps`` steps each, timed on
rank 0 (every step synchronises the ranks); a configuration's throughput is its median
window in samples/s over all ranks. Scaling efficiency = 2-rank samples/s /
(2 x single-process samples/s); targets: >= 0.75 on the MLP, >= 0.95 on the CNN.
Each round runs every configuration of one model back to back, then the next model.
Output: one JSON line per measurement (with rank 0's minor page faults per timed step:
memory that went back to the kernel and was touched again), then a table, and the results
file (``benchmarks/_common.py``: command, machine, date, commit, every measurement and
the table), by default ``benchmarks/results/bench_tf_training.json``. ``--quick`` makes
everything short: it checks that all of it runs, the numbers are only indicative, and it
writes no results file unless ``--results PATH`` is given.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (ResultsRun, add_hosts_options, add_results_options, emulated_hosts_for,  # sibling module
                     host_address, host_of_rank, launcher, on_host, results_path)

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tensorflow2" / "tensorflow2_synthetic_benchmark.py"
BATCH = {"mlp": 64, "resnet": 32}
TARGET = {"mlp": 0.75, "resnet": 0.95}
PARAMS = {"mlp": 9_557_110, "resnet": 2_777_674}
# With --hosts: the emulated hosts (tests.hosts.emulated.EmulatedHosts) and the ranks on each.
HOSTS: Any = None
LAYOUT: list[int] = []
# Modes whose ranks talk to each other: the ones --hosts spreads over the hosts.
ACROSS_HOSTS = ("hvdlite", "lockstep", "hvdlite_overlap", "hvdlite_pyfunc", "mwms")
# hvdlite run with extra environment: the same worker code as "hvdlite".
HVDLITE_VARIANTS = {"hvdlite_overlap": {"HVDLITE_TF_OVERLAP": "1"}, "hvdlite_pyfunc": {"HVDLITE_TF_KERNEL": "0"}}
_mwms_port = 23400
MODES = ("single", "hvdlite", "single_tuned", "independent", "lockstep", "hvdlite_overlap",
         "mwms")  # the two compared most, back to back
# What hvdlite's engine sets with mallopt() at init (TuneHostAllocator in engine.cc).
HVDLITE_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20),
                      "MALLOC_TOP_PAD_": str(64 << 20)}


# ------------------------------------------------------------------ worker side

def configure_tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def load_example() -> Any:
    """The model definitions of examples/tensorflow2/tensorflow2_synthetic_benchmark.py."""
    spec = importlib.util.spec_from_file_location("hvdlite_tf2_synthetic", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_model(name: str, backward_idle_ms: float = 0.0) -> Any:
    model = load_example().MODELS[name][0]()
    n = sum(int(v.numpy().size) for v in model.trainable_variables)
    assert n == PARAMS[name], f"{name}: {n} parameters, expected {PARAMS[name]}"
    if backward_idle_ms > 0:
        model = with_idle_backward(model, backward_idle_ms / 1000)
    return model


def with_idle_backward(model: Any, seconds: float) -> Any:
    """``model`` (a Sequential, such as the MLP) with an op after every layer whose
    gradient sleeps ``seconds`` with the CPU idle, as it would be while an accelerator
    computes that layer's backward pass: the case in which hvdlite_overlap's
    communication has a core to run on. Same weights, same values."""
    import keras
    import tensorflow as tf

    def wait(dy):
        time.sleep(seconds)
        return dy

    @tf.custom_gradient
    def idle_in_backward(h):
        def grad(dy):
            out = tf.py_function(wait, [dy], dy.dtype)
            out.set_shape(dy.shape)
            return out
        return tf.identity(h), grad

    inputs = keras.Input(model.input_shape[1:])
    h = inputs
    for layer in model.layers:
        h = keras.layers.Lambda(idle_in_backward)(layer(h))
    return keras.Model(inputs, h, name=f"{model.name}_idle_backward")


def batch(name: str, size: int, seed: int) -> tuple[Any, Any]:
    import numpy as np
    rng = np.random.default_rng(seed)
    shape = (1024,) if name == "mlp" else (32, 32, 3)
    return (rng.standard_normal((size,) + shape).astype(np.float32),
            rng.integers(0, 10, size=size).astype(np.int32))


def flat_weights(model: Any) -> Any:
    import numpy as np
    return np.concatenate([np.asarray(w).ravel() for w in model.trainable_variables])


def make_optimizer(lr: float = 0.01, momentum: float = 0.9) -> Any:
    import keras
    return keras.optimizers.SGD(lr, momentum=momentum)


class StepMarks:
    """The time and this process's minor page faults so far (page faults that needed no
    I/O: memory handed back to the kernel and touched again), at the start of every
    step and at the end. With hvdlite, also the engine's count of 2 MiB extents remapped
    onto huge pages (see hvdlite/csrc/backends/mpi/host_memory.h), read at every mark: once the last
    step is done, the other rank may already have shut the engine down."""

    def __init__(self, hvd_stats: Any = None) -> None:
        self.stamps: list[float] = []
        self.faults: list[int] = []
        self.hvd_stats = hvd_stats
        self.huge_page_extents: int | None = None

    def mark(self) -> None:
        self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
        self.stamps.append(time.perf_counter())
        if self.hvd_stats is not None:
            try:
                self.huge_page_extents = self.hvd_stats()["huge_page_extents"]
            except Exception:  # shut down by the other rank after the last step
                pass


def batch_clock(marks: StepMarks) -> Any:
    """A Keras callback that marks the start of every batch and the end of training."""
    import keras

    class Clock(keras.callbacks.Callback):
        def on_train_batch_begin(self, b, logs=None):
            marks.mark()

        def on_train_end(self, logs=None):
            marks.mark()

    return Clock()


def window_times(stamps: list[float], warmup: int, steps: int, windows: int) -> list[float]:
    return [stamps[warmup + (w + 1) * steps] - stamps[warmup + w * steps] for w in range(windows)]


def worker(args: argparse.Namespace) -> None:
    """One process of one configuration; rank 0 prints ``BENCH_RESULT {json}`` lines."""
    tf = configure_tf()
    mode = args.worker
    strategy = None
    rank, nranks = 0, 1
    hvd = hvdk = None
    if mode == "mwms":
        comm = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)
        rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        nranks = strategy.num_replicas_in_sync
    elif mode in ("hvdlite", "lockstep", *HVDLITE_VARIANTS):
        if mode in HVDLITE_VARIANTS:
            mode = "hvdlite"  # the same code; run_mode set the variant's environment
        import hvdlite.tensorflow as hvd
        import hvdlite.tensorflow.keras as hvdk
        hvd.init()
        rank, nranks = hvd.rank(), hvd.size()
        from hvdlite.common import basics
    import keras
    import numpy as np

    def scope():
        return strategy.scope() if strategy is not None else contextlib.nullcontext()

    def emit(record: dict) -> None:
        if rank == 0:
            print("BENCH_RESULT " + json.dumps(record), flush=True)

    # ---- correctness: one SGD step on the MLP against the single-process step
    if args.verify:
        gx, gy = batch("mlp", 2 * BATCH["mlp"], seed=123)
        for api in args.apis:
            with scope():
                keras.utils.set_random_seed(7)
                model = build_model("mlp")
                opt = make_optimizer(0.05, 0.0)
                if mode == "hvdlite" and api == "fit":
                    opt = hvdk.DistributedOptimizer(opt)
                loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            if mode == "single":
                x, y = gx, gy
            else:
                half = gx.shape[0] // nranks
                x, y = gx[rank * half:(rank + 1) * half], gy[rank * half:(rank + 1) * half]
            if api == "loop":
                step = make_loop_step(tf, model, opt, loss_fn, mode, strategy, hvd)
                step(tf.constant(x), tf.constant(y))
            else:
                with scope():
                    model.compile(optimizer=opt, loss=loss_fn)
                if mode == "mwms":
                    _patch_keras_for_mwms(tf, model, strategy, x, y)
                    ds = strategy.distribute_datasets_from_function(
                        lambda ctx: tf.data.Dataset.from_tensors((x, y)))
                    model.fit(ds, epochs=1, verbose=0)
                else:
                    model.fit(x, y, batch_size=x.shape[0], epochs=1, verbose=0, shuffle=False)
            w = flat_weights(model)
            if rank == 0:
                np.save(Path(args.verify) / f"{args.worker}_{api}.npy", w)

    # ---- timing
    total = args.warmup + args.steps * args.windows
    for name in args.models:
        for api in args.apis:
            with scope():
                keras.utils.set_random_seed(0)
                model = build_model(name, args.backward_idle_ms)
                opt = make_optimizer()
                if mode == "hvdlite" and api == "fit":
                    opt = hvdk.DistributedOptimizer(opt)
                if mode == "lockstep":
                    opt = lockstep_optimizer(tf, opt, hvd)
                loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            x, y = batch(name, BATCH[name], seed=rank)
            start_together(args.start_dir, f"{name}_{api}")
            marks = StepMarks(None if hvd is None else lambda: basics.core().stats())
            if api == "loop":
                step = make_loop_step(tf, model, opt, loss_fn, mode, strategy, hvd)
                xt, yt = tf.constant(x), tf.constant(y)
                for _ in range(total):
                    marks.mark()
                    step(xt, yt).numpy()
                marks.mark()
            else:
                with scope():
                    model.compile(optimizer=opt, loss=loss_fn)
                if mode == "mwms":
                    _patch_keras_for_mwms(tf, model, strategy, x, y)
                    ds = strategy.distribute_datasets_from_function(
                        lambda ctx: tf.data.Dataset.from_tensors((x, y)).repeat())
                else:
                    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
                model.fit(ds, steps_per_epoch=total, epochs=1, verbose=0, callbacks=[batch_clock(marks)])
            times = window_times(marks.stamps, args.warmup, args.steps, args.windows)
            timed_steps = args.steps * args.windows
            res = {"model": name, "api": api, "mode": mode, "ranks": nranks, "times": times,
                   "minflt_per_step": (marks.faults[args.warmup + timed_steps] - marks.faults[args.warmup])
                   / timed_steps}
            if marks.huge_page_extents is not None:
                res["huge_page_extents"] = marks.huge_page_extents
            if mode == "lockstep":
                res["allreduce_ms"] = gradient_allreduce_ms(model)
            emit(res)
    if hvd is not None:
        hvd.shutdown()


def gradient_allreduce_ms(model: Any, reps: int = 15) -> float:
    """Median milliseconds hvdlite takes to average arrays of the shapes of ``model``'s
    gradients (float32, one request each, all in flight together) over the ranks, with
    nothing else running; every call starts after a barrier."""
    import numpy as np
    import hvdlite as hvd_np  # the NumPy front end, on the engine hvdlite.tensorflow started
    arrays = [np.asarray(v.numpy(), dtype=np.float32) + 0 for v in model.trainable_variables]
    times = []
    for rep in range(reps + 3):
        hvd_np.barrier()
        t0 = time.perf_counter()
        handles = [hvd_np.allreduce_async(a, name=f"bench.gradient_allreduce.{i}", op=hvd_np.Average)
                   for i, a in enumerate(arrays)]
        for h in handles:
            hvd_np.synchronize(h)
        if rep >= 3:
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def start_together(start_dir: str, label: str) -> None:
    """Independent processes (no MPI between them) wait here for each other: each leaves
    a file in ``start_dir`` and waits until every process has."""
    if not start_dir:
        return
    n = int(os.environ["HVDLITE_BENCH_PROCESSES"])
    Path(start_dir, f"{label}.{os.environ['HVDLITE_BENCH_INDEX']}").touch()
    while len(list(Path(start_dir).glob(f"{label}.*"))) < n:
        time.sleep(0.005)


def _patch_keras_for_mwms(tf: Any, model: Any, strategy: Any, x: Any, y: Any) -> None:
    """Work around two failures of Keras 3.15's ``fit`` under MultiWorkerMirroredStrategy
    on this TensorFlow (benchmark only; hvdlite does not need them):

    * ``_maybe_symbolic_build`` reduces a data batch with ``strategy.reduce`` and fails
      ("Attempt to convert a value (PerReplica...)"): build from a local batch instead;
    * the train step's logs are reduced with ``strategy.reduce("MEAN", v, axis=0)``,
      which fails on scalar losses ("Invalid reduction dimension 0 for input with 0
      dimensions"): reduce scalars with ``axis=None``.
    Each worker feeds its own per-replica batch through
    ``distribute_datasets_from_function``, so the step matches single-process training
    on the global batch (checked before timing)."""
    import keras.src.backend.tensorflow.trainer as kt

    def symbolic_build(iterator=None, data_batch=None):
        with strategy.scope():
            model._symbolic_build(data_batch=(x[:2], y[:2]))
    model._maybe_symbolic_build = symbolic_build
    if getattr(kt.reduce_per_replica, "_hvdlite_patched", False):
        return
    original = kt.reduce_per_replica

    def reduce_per_replica(values, strat, reduction="auto"):
        if kt._collective_all_reduce_multi_worker(strat) and reduction in ("auto", "mean"):
            def reduce_one(v):
                local = strat.experimental_local_results(v)[0] if kt._is_per_replica_instance(v) else v
                if getattr(local, "shape", None) is not None and local.shape.rank == 0:
                    return strat.reduce("MEAN", v, axis=None)
                return original(v, strat, reduction)
            return kt.tree.map_structure(reduce_one, values)
        return original(values, strat, reduction)
    reduce_per_replica._hvdlite_patched = True
    kt.reduce_per_replica = reduce_per_replica


def lockstep_optimizer(tf: Any, opt: Any, hvd: Any) -> Any:
    """A copy of ``opt`` whose update first waits, after every gradient exists, for a
    one-float allreduce: the ranks stay in step as under hvdlite, but keep their own
    gradients (mode ``lockstep``)."""

    class Lockstep(type(opt)):
        def apply(self, grads, trainable_variables=None):
            grads = list(grads)
            with tf.control_dependencies([g for g in grads if g is not None]):
                token = hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="lockstep")
            with tf.control_dependencies([token]):
                grads = [None if g is None else tf.identity(g) for g in grads]
            return super().apply(grads, trainable_variables)

    return Lockstep.from_config(opt.get_config())


def make_loop_step(tf: Any, model: Any, opt: Any, loss_fn: Any, mode: str, strategy: Any,
                   hvd: Any) -> Any:
    """A custom training step. hvdlite: DistributedGradientTape. MWMS: ``strategy.run``,
    where the Keras loss already divides by the replicas and apply_gradients sums."""

    def local_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        if mode == "hvdlite":
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    if mode == "mwms":
        @tf.function
        def step(x, y):
            per_replica = strategy.run(local_step, args=(x, y))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return step
    return tf.function(local_step)


# ------------------------------------------------------------------ driver side

def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def worker_args(args: argparse.Namespace, mode: str, verify_dir: str) -> list[str]:
    return [str(Path(__file__).resolve()), "--worker", mode, "--models", ",".join(args.models),
            "--apis", ",".join(args.apis), "--warmup", str(args.warmup), "--steps", str(args.steps),
            "--windows", str(args.windows), "--backward-idle-ms", str(args.backward_idle_ms)] + (
                ["--verify", verify_dir] if verify_dir else [])


def parse_results(out: str) -> list[dict]:
    return [json.loads(ln.split(" ", 1)[1]) for ln in out.splitlines() if ln.startswith("BENCH_RESULT ")]


def run_mode(mode: str, args: argparse.Namespace, verify_dir: str) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if mode in ("single_tuned", "independent"):
        env.update(HVDLITE_MALLOC_ENV)
        cmd_tail = [sys.executable] + worker_args(args, "single", "")
    else:
        env.update(HVDLITE_VARIANTS.get(mode, {}))
        cmd_tail = [sys.executable] + worker_args(args, mode, "" if mode == "lockstep" else verify_dir)
    if mode in ("single", "single_tuned"):
        procs = [subprocess.Popen(cmd_tail, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    elif mode == "independent":
        start_dir = tempfile.mkdtemp(prefix="hvdlite_bench_start_")
        procs = [subprocess.Popen(cmd_tail + ["--start-dir", start_dir],
                                  env=dict(env, HVDLITE_BENCH_PROCESSES=str(args.ranks), HVDLITE_BENCH_INDEX=str(i)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(args.ranks)]
    elif mode in ("hvdlite", "lockstep", *HVDLITE_VARIANTS):
        hosts = []
        if HOSTS is not None:
            hosts = ["-H", HOSTS.host_spec(LAYOUT)]
            env.update(HOSTS.env())
        procs = [subprocess.Popen(launcher(args.ranks) + hosts + cmd_tail, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)]
    else:
        if HOSTS is None:
            cluster = {"worker": [f"localhost:{p}" for p in free_ports(args.ranks)]}
            prefixes = [[] for _ in range(args.ranks)]
        else:
            # Each worker inside its host's namespace, at that host's address; fresh ports
            # for every run (a new namespace has none in use, and none left in TIME_WAIT).
            global _mwms_port
            _mwms_port += args.ranks
            where = [host_of_rank(i, LAYOUT) for i in range(args.ranks)]
            cluster = {"worker": [f"{host_address(HOSTS, h)}:{_mwms_port + i}" for i, h in enumerate(where)]}
            prefixes = [on_host(HOSTS, h) for h in where]
        procs = []
        for i in range(args.ranks):
            e = dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
            procs.append(subprocess.Popen(prefixes[i] + cmd_tail, env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=args.timeout)
            outs.append((p.returncode, o, e))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        sys.exit(f"{mode}: timed out after {args.timeout} s")
    for rc, o, e in outs:
        if rc != 0:
            sys.exit(f"{mode} failed ({rc}):\n{o[-3000:]}\n{e[-5000:]}")
    if mode == "independent":
        # Each process reports as a single one; window k of all of them ran at once.
        per_process = [parse_results(o) for _, o, _ in outs]
        merged = []
        for recs in zip(*per_process):
            merged.append(dict(recs[0], ranks=len(recs),
                               times=[max(ts) for ts in zip(*(r["times"] for r in recs))]))
        return merged
    return parse_results(outs[0][1])


def check_verification(verify_dir: str, apis: list[str]) -> dict[str, float]:
    import numpy as np
    errors = {}
    for api in apis:
        ref = np.load(Path(verify_dir) / f"single_{api}.npy")
        for mode in ("hvdlite", *HVDLITE_VARIANTS, "mwms"):
            f = Path(verify_dir) / f"{mode}_{api}.npy"
            if not f.exists():
                continue
            got = np.load(f)
            errors[f"{mode}_{api}"] = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-12))
    return errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short windows, one round")
    p.add_argument("--models", default="mlp,resnet")
    p.add_argument("--apis", default="loop,fit")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="steps per timed window")
    p.add_argument("--windows", type=int, default=None)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--backward-idle-ms", type=float, default=0.0,
                   help="MLP only: each layer's gradient also sleeps this long with the CPU idle, "
                        "as while an accelerator computes (where overlapping communication pays)")
    p.add_argument("--json-out", default="")
    add_hosts_options(p)
    add_results_options(p, "bench_tf_training")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)
    p.add_argument("--verify", default="", help=argparse.SUPPRESS)
    p.add_argument("--start-dir", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    if args.backward_idle_ms > 0 and args.models != ["mlp"]:
        p.error("--backward-idle-ms needs --models mlp")
    args.apis = [a for a in args.apis.split(",") if a]
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    args.steps = args.steps or (4 if args.quick else 15)
    args.windows = args.windows or (3 if args.quick else 5)
    if args.worker:
        worker(args)
        return 0
    if not args.hosts:
        return run_benchmark(args)
    global HOSTS, LAYOUT
    with emulated_hosts_for(p, args) as (HOSTS, LAYOUT):
        modes = [m for m in args.modes.split(",") if m]
        print(f"{', '.join(m for m in modes if m in ACROSS_HOSTS) or 'no mode'} on emulated hosts "
              f"{HOSTS.host_spec(LAYOUT)}, links {args.rate} both ways ({HOSTS.subnet}); "
              f"{', '.join(m for m in modes if m not in ACROSS_HOSTS) or 'no mode'} on this host", flush=True)
        try:
            return run_benchmark(args)
        finally:
            HOSTS = None


def run_benchmark(args: argparse.Namespace) -> int:
    run = ResultsRun("bench_tf_training")
    modes = [m for m in args.modes.split(",") if m]
    verify_dir = tempfile.mkdtemp(prefix="hvdlite_bench_tf_")
    collected: dict[tuple[str, str, str], list[float]] = {}
    allreduce_ms: dict[tuple[str, str], list[float]] = {}
    records: list[dict] = []
    verification: dict[str, float] = {}

    def record(res: list[dict], mode: str, rnd: int) -> None:
        for r in res:
            samples = BATCH[r["model"]] * r["ranks"] * args.steps
            rate = statistics.median(samples / t for t in r["times"])
            rec = {"model": r["model"], "api": r["api"], "mode": mode, "ranks": r["ranks"],
                   "batch_per_rank": BATCH[r["model"]], "samples_per_s": rate,
                   "step_ms": 1000 * statistics.median(r["times"]) / args.steps,
                   "rank0_minflt_per_step": round(r["minflt_per_step"], 1), "round": rnd,
                   "threads_per_rank": 1}
            if HOSTS is not None and mode in ACROSS_HOSTS:
                rec["hosts"], rec["rate"] = HOSTS.host_spec(LAYOUT), HOSTS.rate
            if "huge_page_extents" in r:
                rec["rank0_huge_page_extents"] = r["huge_page_extents"]
            if "allreduce_ms" in r:
                rec["allreduce_ms"] = r["allreduce_ms"]
                # lockstep's step made longer by one allreduce of the gradients, as samples/s
                ceiling = rate * rec["step_ms"] / (rec["step_ms"] + r["allreduce_ms"])
                collected.setdefault((r["model"], r["api"], "lockstep_plus_allreduce"), []).append(ceiling)
                allreduce_ms.setdefault((r["model"], r["api"]), []).append(r["allreduce_ms"])
            print(json.dumps(rec), flush=True)
            records.append(rec)
            collected.setdefault((r["model"], r["api"], mode), []).append(rate)

    # Each model's configurations run back to back, so that the host's drift over the
    # minutes a model takes does not fall between its single and distributed runs.
    for rnd in range(args.rounds):
        for k, model in enumerate(args.models):
            verify = rnd == 0 and k == 0
            for mode in modes:
                res = run_mode(mode, argparse.Namespace(**dict(vars(args), models=[model])),
                               verify_dir if verify else "")
                record(res, mode, rnd)
            if verify and "single" in modes:
                errors = check_verification(verify_dir, args.apis)
                verification.update(errors)
                print(json.dumps({"verification_max_rel_error": errors}), flush=True)
                bad = {key: v for key, v in errors.items() if not v < 1e-4}
                if bad:
                    sys.exit(f"distributed step differs from the single-process step on the global batch: {bad}")

    print()
    head = (f"{'model':7} {'api':5} {'single/s':>9} {'tuned/s':>8} {'hvdlite/s':>10} {'MWMS/s':>9} "
            f"{'hvdlite/MWMS':>13} {'eff hvdlite':>12} {'vs tuned':>9} {'ceiling':>8} {'of ceiling':>11} "
            f"{'lockstep':>9} {'of lockstep':>12} {'lock+AR':>8} {'of lock+AR':>11} {'overlap/lock':>13} "
            f"{'eff MWMS':>9} {'target':>7} {'hvd/pyfunc':>11}")
    print(head)
    print("-" * len(head))
    table = []
    for model in args.models:
        for api in args.apis:
            med = {m: statistics.median(collected[(model, api, m)]) for m in modes + ["lockstep_plus_allreduce"]
                   if (model, api, m) in collected}
            s, h, w = med.get("single"), med.get("hvdlite"), med.get("mwms")
            st, ind, lock = med.get("single_tuned"), med.get("independent"), med.get("lockstep")
            lpa, ov = med.get("lockstep_plus_allreduce"), med.get("hvdlite_overlap")
            pyf = med.get("hvdlite_pyfunc")
            row = {"model": model, "api": api, "single": s, "single_tuned": st, "hvdlite": h, "mwms": w,
                   **({"hosts": HOSTS.host_spec(LAYOUT), "rate": args.rate} if HOSTS is not None else {}),
                   "hvdlite_over_mwms": h / w if h and w else None,
                   "efficiency_hvdlite": h / (args.ranks * s) if h and s else None,
                   "efficiency_hvdlite_vs_tuned_single": h / (args.ranks * st) if h and st else None,
                   "independent": ind,
                   "ceiling_efficiency": ind / (args.ranks * s) if ind and s else None,
                   "hvdlite_over_independent": h / ind if h and ind else None,
                   "lockstep": lock,
                   "lockstep_efficiency": lock / (args.ranks * s) if lock and s else None,
                   "hvdlite_over_lockstep": h / lock if h and lock else None,
                   "allreduce_ms": statistics.median(allreduce_ms[(model, api)]) if (model, api) in allreduce_ms else None,
                   "lockstep_plus_allreduce": lpa,
                   "lockstep_plus_allreduce_over_lockstep": lpa / lock if lpa and lock else None,
                   "hvdlite_over_lockstep_plus_allreduce": h / lpa if h and lpa else None,
                   "hvdlite_overlap": ov,
                   "hvdlite_overlap_over_lockstep": ov / lock if ov and lock else None,
                   "efficiency_mwms": w / (args.ranks * s) if w and s else None,
                   "target": TARGET[model],
                   "hvdlite_pyfunc": pyf,
                   "hvdlite_over_pyfunc": h / pyf if h and pyf else None,
                   "rounds": args.rounds}
            # Per round, the ratios of runs made minutes apart (min and max over rounds).
            for name, (a, b) in (("hvdlite_over_mwms", ("hvdlite", "mwms")),
                                 ("efficiency_hvdlite", ("hvdlite", "single"))):
                pairs = list(zip(collected.get((model, api, a), []), collected.get((model, api, b), [])))
                if pairs:
                    scale = args.ranks if name.startswith("efficiency") else 1
                    per_round = [x / (scale * y) for x, y in pairs]
                    row[f"{name}_range"] = [min(per_round), max(per_round)]
            for m in modes:
                if (model, api, m) in collected:
                    row[f"{m}_spread"] = [min(collected[(model, api, m)]), max(collected[(model, api, m)])]
            table.append(row)

            def fmt(v, spec):
                return format(v, spec) if v is not None else "-".rjust(int(spec.split(".")[0]))
            print(f"{model:7} {api:5} {fmt(s, '9.1f')} {fmt(st, '8.1f')} {fmt(h, '10.1f')} {fmt(w, '9.1f')} "
                  f"{fmt(row['hvdlite_over_mwms'], '13.3f')} {fmt(row['efficiency_hvdlite'], '12.3f')} "
                  f"{fmt(row['efficiency_hvdlite_vs_tuned_single'], '9.3f')} "
                  f"{fmt(row['ceiling_efficiency'], '8.3f')} {fmt(row['hvdlite_over_independent'], '11.3f')} "
                  f"{fmt(row['lockstep_efficiency'], '9.3f')} {fmt(row['hvdlite_over_lockstep'], '12.3f')} "
                  f"{fmt(row['lockstep_plus_allreduce_over_lockstep'], '8.3f')} "
                  f"{fmt(row['hvdlite_over_lockstep_plus_allreduce'], '11.3f')} "
                  f"{fmt(row['hvdlite_overlap_over_lockstep'], '13.3f')} "
                  f"{fmt(row['efficiency_mwms'], '9.3f')} {TARGET[model]:7.2f} "
                  f"{fmt(row['hvdlite_over_pyfunc'], '11.3f')}")
            print(json.dumps({"summary": row}), flush=True)
    print(f"\n(samples/s over all ranks, median of {args.rounds} round(s) x {args.windows} windows of "
          f"{args.steps} steps; 1 intra-op + 1 inter-op thread per process; "
          f"efficiency = {args.ranks}-rank / ({args.ranks} x single); 'vs tuned': against single_tuned, "
          f"the single process with hvdlite's malloc settings; 'ceiling': {args.ranks} of those at once with "
          f"no communication, as an efficiency; 'of ceiling': hvdlite / that; 'lockstep': "
          f"{args.ranks} ranks kept in step but not sharing gradients, as an efficiency; 'of lockstep': "
          f"hvdlite / that; 'lock+AR': lockstep with its step lengthened by one allreduce of the "
          f"gradients timed alone, over lockstep; 'of lock+AR': hvdlite / that; 'overlap/lock': "
          f"hvdlite with HVDLITE_TF_OVERLAP=1 over lockstep; 'hvd/pyfunc': hvdlite over hvdlite_pyfunc, "
          f"its collectives in graphs as blocking py_function ops)")
    if HOSTS is not None:
        print(f"({', '.join(m for m in modes if m in ACROSS_HOSTS)} on {args.hosts} emulated hosts, "
              f"{HOSTS.host_spec(LAYOUT)}, links {args.rate}; every host shares this machine's cores)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"summary": table}, indent=1))
    run.write(results_path(args, "bench_tf_training", args.quick), records, table,
              {k: v for k, v in vars(args).items() if k not in ("worker", "verify", "start_dir")}, args.notes,
              extra={"verification_max_rel_error": verification})
    return 0


if __name__ == "__main__":
    sys.exit(main())
