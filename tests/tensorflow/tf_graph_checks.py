"""Collectives in TensorFlow 1 graphs run by tf.compat.v1.Session, and several of them in
one graph, with hvdlite's asynchronous graph ops (hvdlite/tensorflow/_kernels.py); typed
errors inside graphs. Registered into tf_checks_common.CHECKS and run by
tf_graph_worker.py; references are NumPy over every rank's seeded data.

A Session runs the independent ops of a graph in whatever order its executor picks, and
the ranks pick differently. To make that certain here, each graph is built in an order
that depends on the rank (reversed on odd ranks): every rank runs the same collectives,
and none may wait for another rank to run them in its order.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import tensorflow as tf

from tf_checks_common import N, R, FAILURES, check, data, expect, expect_close, hvd

# A step that deadlocks fails the check instead of hanging the launch. (A Session's own
# step timeout cannot end a step whose thread is blocked inside an op.)
STEP_TIMEOUT_S = 120


class Deadlocked(Exception):
    pass


def session_config(inter_op_threads=1):
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter_op_threads,
                                    intra_op_parallelism_threads=1)


def in_session(graph, work, inter_op_threads=1):
    """Returns `work(sess)` for a new Session on `graph`, run on a thread watched for
    STEP_TIMEOUT_S. Raises Deadlocked if it does not finish (the stuck step fails once
    hvdlite shuts down)."""
    result = {}

    def target():
        try:
            with tf.compat.v1.Session(graph=graph, config=session_config(inter_op_threads)) as sess:
                result["value"] = work(sess)
        except BaseException as e:  # noqa: BLE001 - re-raised on the check's thread
            result["error"] = e
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(STEP_TIMEOUT_S)
    if thread.is_alive():
        raise Deadlocked(f"the Session step did not finish in {STEP_TIMEOUT_S} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def run_steps(graph, fetches, steps=1, inter_op_threads=1):
    """Runs `fetches` of `graph` `steps` times in one new Session (see in_session);
    returns the last step's values."""
    return in_session(graph, lambda sess: [sess.run(fetches) for _ in range(steps)][-1], inter_op_threads)


def run_session(graph, fetches, inter_op_threads=1):
    return run_steps(graph, fetches, 1, inter_op_threads)


def rank_order(items):
    """`items` in the order this rank builds them: reversed on odd ranks."""
    items = list(items)
    return items[::-1] if R % 2 else items


def graph_op_types(graph):
    return {op.type for op in graph.get_operations()}


def require_graph_ops(what):
    """The asynchronous graph ops must be what runs (tests run where g++ exists)."""
    from hvdlite.tensorflow import _kernels
    if _kernels.library() is None:
        FAILURES.append(f"{what}: hvdlite's TensorFlow ops are not available: {_kernels.unavailable_reason()}")
        return False
    return True


@check
def session_independent_allreduces_do_not_deadlock():
    """20 independent allreduces in one TF1 graph, one inter-op thread: with blocking
    py_function collectives the ranks each waited in a different one for ever."""
    if not require_graph_ops("session allreduces"):
        return
    vals = {i: [data(r, (3, 4), np.float32, seed=100 + i) for r in range(N)] for i in range(20)}
    g = tf.Graph()
    with g.as_default():
        outs = {}
        for i in rank_order(range(20)):
            outs[i] = hvd.allreduce(tf.constant(vals[i][R]), op=hvd.Sum, name=f"independent.{i}")
    expect("HvdliteCollectives" in graph_op_types(g) and "EagerPyFunc" not in graph_op_types(g),
           f"session graph ops: {sorted(graph_op_types(g))}")
    for inter_op, steps in ((1, 1), (2, 1), (1, 3)):  # 3 steps: then from the response cache
        what = f"{inter_op} inter-op thread(s), {steps} step(s)"
        try:
            got = run_steps(g, outs, steps, inter_op)
        except Deadlocked as e:
            FAILURES.append(f"{what}: {e}")
            return
        for i in range(20):
            expect_close(got[i], np.sum(vals[i], 0), f"{what}: allreduce {i}", rtol=1e-5)


@check
def function_independent_allreduces():
    """20 independent allreduces inside one tf.function, each its own asynchronous op.
    Inside a tf.function TensorFlow runs stateful ops in program order, which is the
    same on every rank (as in Horovod, the program must issue the same collectives in
    the same order on every rank), so here the order does not depend on the rank."""
    vals = {i: [data(r, (5,), np.float64, seed=200 + i) for r in range(N)] for i in range(20)}

    @tf.function
    def step():
        return {i: hvd.allreduce(tf.constant(vals[i][R]), op=hvd.Average, name=f"fn_independent.{i}")
                for i in range(20)}
    got = step()
    for i in range(20):
        expect_close(got[i], np.mean(vals[i], 0), f"tf.function allreduce {i}")
    ops = [op.type for op in step.get_concrete_function().graph.get_operations()]
    expect(ops.count("HvdliteCollectives") == 20 and "EagerPyFunc" not in ops,
           f"tf.function graph: {ops.count('HvdliteCollectives')} HvdliteCollectives ops, expected 20")


def alltoall_case(r):
    """Input and splits of rank r in an alltoall where one rank sends nothing (as in
    Horovod's tests): rank 0 sends no rows, every other rank r sends r+1 rows to each rank."""
    splits = [0] * N if r == 0 else [r + 1] * N
    x = np.concatenate([np.full((s, 2), 10 * r + d, np.float32) for d, s in enumerate(splits)]) \
        if sum(splits) else np.zeros((0, 2), np.float32)
    return x, splits


@check
def session_mixed_collectives_in_one_graph():
    """Every kind of collective, and gradients of two, in one TF1 graph run by a Session
    with one inter-op thread, built in a rank-dependent order."""
    if not require_graph_ops("mixed session graph"):
        return
    ar = [data(r, (4, 3), np.float32, seed=300) for r in range(N)]
    grp = [[data(r, (2,), np.float64, seed=301), data(r, (3, 1), np.float64, seed=302)] for r in range(N)]
    ag = [data(r, (r + 1, 2), np.int32, seed=303) for r in range(N)]
    agb = [data(r, (r + 2, 3), np.bool_, seed=304) for r in range(N)]
    bc = [data(r, (2, 2), np.float32, seed=305) for r in range(N)]
    rows = 2 * N + 1
    rs = [data(r, (rows, 2), np.float32, seed=306) for r in range(N)]
    sl = [data(r, (1, 3), np.float32, seed=307) for r in range(N)]
    a2a = [alltoall_case(r) for r in range(N)]
    g = tf.Graph()
    fetch = {}
    with g.as_default():
        x_grad = tf.constant(ag[R].astype(np.float32))
        builders = {
            "allreduce_sum": lambda: hvd.allreduce(tf.constant(ar[R]), op=hvd.Sum, name="mixed.sum"),
            "allreduce_avg": lambda: hvd.allreduce(tf.constant(ar[R]), name="mixed.avg"),
            "grouped": lambda: hvd.grouped_allreduce([tf.constant(t) for t in grp[R]], op=hvd.Sum,
                                                     name="mixed.grouped"),
            "allgather": lambda: hvd.allgather(tf.constant(ag[R]), name="mixed.gather"),
            "allgather_bool": lambda: hvd.allgather(tf.constant(agb[R]), name="mixed.gather_bool"),
            "grouped_allgather": lambda: hvd.grouped_allgather(
                [tf.constant(ag[R]), tf.constant(agb[R])], name="mixed.ggather"),
            "broadcast": lambda: hvd.broadcast(tf.constant(bc[R]), N - 1, name="mixed.bcast"),
            "alltoall": lambda: hvd.alltoall(tf.constant(a2a[R][0]), splits=tf.constant(a2a[R][1], tf.int32),
                                             name="mixed.a2a"),
            "reducescatter": lambda: hvd.reducescatter(tf.constant(rs[R]), op=hvd.Sum, name="mixed.rs"),
            "grouped_reducescatter": lambda: hvd.grouped_reducescatter(
                [tf.constant(rs[R]), tf.constant(2 * rs[R])], op=hvd.Average, name="mixed.grs"),
            "sparse": lambda: hvd.allreduce(tf.IndexedSlices(tf.constant(sl[R]), tf.constant([R], tf.int64),
                                                             dense_shape=tf.constant([N, 3], tf.int64)),
                                            op=hvd.Sum, name="mixed.sparse").values,
            # Horovod's grouped allreduce of IndexedSlices (with a dense member)
            "grouped_sparse": lambda: [
                r.values if isinstance(r, tf.IndexedSlices) else r for r in hvd.grouped_allreduce(
                    [tf.IndexedSlices(tf.constant(2 * sl[R]), tf.constant([R], tf.int64),
                                      dense_shape=tf.constant([N, 3], tf.int64)), tf.constant(ar[R])],
                    op=hvd.Sum, name="mixed.grouped_sparse")],
            "gather_grad": lambda: tf.gradients(tf.reduce_sum(hvd.allgather(x_grad, name="mixed.gg") ** 2),
                                                x_grad)[0],
        }
        for key in rank_order(sorted(builders)):
            fetch[key] = builders[key]()
    try:
        got = run_session(g, fetch)
    except Deadlocked as e:
        FAILURES.append(str(e))
        return
    expect_close(got["allreduce_sum"], np.sum(ar, 0), "allreduce sum", rtol=1e-5)
    expect_close(got["allreduce_avg"], np.mean(ar, 0), "allreduce average", rtol=1e-5)
    for i in range(2):
        expect_close(got["grouped"][i], np.sum([p[i] for p in grp], 0), f"grouped allreduce [{i}]")
    expect(np.array_equal(got["allgather"], np.concatenate(ag)), "allgather int32")
    expect(np.array_equal(got["allgather_bool"], np.concatenate(agb)), "allgather bool (as bytes)")
    expect(np.array_equal(got["grouped_allgather"][0], np.concatenate(ag))
           and np.array_equal(got["grouped_allgather"][1], np.concatenate(agb)), "grouped allgather")
    expect_close(got["broadcast"], bc[N - 1], "broadcast from the last rank")
    out, recv = got["alltoall"]
    want = np.concatenate([a2a[s][0][sum(a2a[s][1][:R]):sum(a2a[s][1][:R + 1])] for s in range(N)])
    expect(out.shape == want.shape and np.array_equal(out, want), f"alltoall: got {out.shape} want {want.shape}")
    expect(list(recv) == [a2a[s][1][R] for s in range(N)], f"alltoall received splits {list(recv)}")
    base, extra = divmod(rows, N)
    counts = [base + (1 if r < extra else 0) for r in range(N)]
    start = sum(counts[:R])
    expect_close(got["reducescatter"], np.sum(rs, 0)[start:start + counts[R]], "reducescatter", rtol=1e-5)
    expect_close(got["grouped_reducescatter"][1], 2 * np.mean(rs, 0)[start:start + counts[R]],
                 "grouped reducescatter", rtol=1e-5)
    expect_close(got["sparse"], np.concatenate(sl), "IndexedSlices allreduce (values)")
    expect_close(got["grouped_sparse"][0], 2 * np.concatenate(sl), "grouped allreduce: IndexedSlices member")
    expect_close(got["grouped_sparse"][1], np.sum(ar, 0), "grouped allreduce: dense member", rtol=1e-5)
    # d/dx sum(allgather(x)^2): this rank's rows of 2*allgather, averaged over ranks
    # (Horovod's rule: the gradient is averaged, then split) -> 2 * x.
    expect_close(got["gather_grad"], 2 * ag[R].astype(np.float32), "gradient of allgather")


@check
def session_broadcast_global_variables():
    """Horovod's TF1 start: variables initialised differently on each rank, then
    hvd.broadcast_global_variables(root) run by the Session gives every rank the root's
    values, in one batch of asynchronous broadcasts; the variables then train in step
    (an allreduce of a gradient-like value added to them)."""
    if not require_graph_ops("broadcast_global_variables"):
        return
    root = N - 1
    init = {name: [data(r, shape, np.float32, seed=400 + k) for r in range(N)]
            for k, (name, shape) in enumerate([("w", (3, 2)), ("b", (2,)), ("step", ())])}
    g = tf.Graph()
    with g.as_default():
        variables = {name: tf.compat.v1.Variable(vals[R], name=name) for name, vals in init.items()}
        bcast = hvd.broadcast_global_variables(root)
        update = variables["w"].assign_add(hvd.allreduce(tf.fill([3, 2], float(R)), op=hvd.Sum,
                                                         name="tf1.update"))
        init_op = tf.compat.v1.global_variables_initializer()

    def work(sess):
        sess.run(init_op)
        before = sess.run(variables)
        sess.run(bcast)
        after = sess.run(variables)
        sess.run(update)
        return before, after, sess.run(variables["w"])
    try:
        before, after, trained = in_session(g, work)
    except Deadlocked as e:
        FAILURES.append(str(e))
        return
    for name, vals in init.items():
        expect_close(before[name], vals[R], f"{name} before the broadcast")
        expect_close(after[name], vals[root], f"{name} after the broadcast from rank {root}")
    expect_close(trained, init["w"][root] + sum(range(N)), "w after an update from an allreduce")
    # Eagerly TensorFlow 2 has no collection of global variables: Horovod's error.
    try:
        hvd.broadcast_global_variables(root)
        FAILURES.append("broadcast_global_variables did not raise eagerly")
    except RuntimeError as e:
        expect("broadcast_variables" in str(e), f"eager broadcast_global_variables: {e}")


def expect_graph_error(e, code_class, what, needles):
    expect(isinstance(e, code_class), f"{what}: raised {type(e).__mro__[:3]}, not {code_class.__name__}")
    for needle in needles:
        expect(needle in str(e), f"{what}: {needle!r} missing from the error: {str(e)[:500]}")


@check
def graph_errors_are_typed_and_recoverable():
    """A collective that fails inside a graph raises Horovod's tf.errors type on every
    rank (a shape mismatch: FailedPreconditionError naming the tensor and the ranks;
    alltoall splits that do not fit: InvalidArgumentError; an op this rank alone asks
    for and hvdlite lacks: UnimplementedError there, FailedPreconditionError elsewhere),
    in a tf.function and in a Session graph together with other collectives, and the
    next collective works."""
    if N == 1 or not require_graph_ops("graph errors"):
        return

    @tf.function
    def mismatch(x):
        return hvd.allreduce(x, name="typed.mismatch")
    try:
        mismatch(tf.ones([R + 2]))
        FAILURES.append("tf.function: mismatched allreduce did not raise")
    except tf.errors.OpError as e:
        expect_graph_error(e, tf.errors.FailedPreconditionError, "tf.function shape mismatch",
                           ["typed.mismatch", "rank 0", f"rank {N - 1}", "shape"])

    g = tf.Graph()
    with g.as_default():
        fine = {i: hvd.allreduce(tf.constant([float(R + i)]), op=hvd.Sum, name=f"typed.fine.{i}")
                for i in rank_order(range(5))}
        bad = hvd.allreduce(tf.ones([R + 1, 2]), name="typed.session_mismatch")
        fine_after = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="typed.after")
        uneven = hvd.alltoall(tf.ones([N + 1]), name="typed.uneven")
        rs = hvd.reducescatter(tf.ones([N, 2]), op=hvd.Max if R == N - 1 else hvd.Sum, name="typed.rs_max")
    try:
        run_session(g, [bad, fine])
        FAILURES.append("Session: mismatched allreduce did not raise")
    except Deadlocked:
        FAILURES.append("Session: a step with a failing collective deadlocked")
    except tf.errors.OpError as e:
        expect_graph_error(e, tf.errors.FailedPreconditionError, "Session shape mismatch",
                           ["typed.session_mismatch", "rank 0", f"rank {N - 1}"])
    got = run_session(g, [fine, fine_after])
    for i in range(5):
        expect_close(got[0][i], [float(sum(range(N)) + N * i)], f"Session allreduce {i} after the failure")
    expect_close(got[1], [float(N)], "Session allreduce after the failure")
    try:
        run_session(g, uneven)
        FAILURES.append("alltoall of N+1 rows without splits did not raise")
    except tf.errors.OpError as e:
        expect_graph_error(e, tf.errors.InvalidArgumentError, "alltoall uneven",
                           ["typed.uneven", "does not divide evenly"])
    try:
        run_session(g, rs)
        FAILURES.append("reducescatter with Max on one rank did not raise")
    except tf.errors.OpError as e:
        want = tf.errors.UnimplementedError if R == N - 1 else tf.errors.FailedPreconditionError
        expect_graph_error(e, want, "reducescatter with Max", [f"rank {N - 1}", "Max"])
    got = run_session(g, fine_after)
    expect_close(got, [float(N)], "Session allreduce after every failure")
    got = tf.function(lambda: hvd.allreduce(tf.constant([2.0]), op=hvd.Sum, name="typed.fn_after"))()
    expect_close(got, [2.0 * N], "tf.function allreduce after the failures")


@check
def graph_collective_fails_with_unknown_error_when_the_engine_stops():
    """Rank 0 shuts down while the other ranks wait in an allreduce inside a tf.function
    that it never joins: theirs fails with UnknownError (Horovod's code for a stopped
    job) naming the tensor and the shutdown. Every rank then starts again."""
    if N > 1 and require_graph_ops("engine stop"):
        if R == 0:
            time.sleep(1.0)
            hvd.shutdown()
        else:
            fn = tf.function(lambda: hvd.allreduce(tf.ones([2]), name="graph.never.joined"))
            try:
                fn()
                FAILURES.append("allreduce in flight at rank 0's shutdown did not raise")
            except tf.errors.OpError as e:
                expect_graph_error(e, tf.errors.UnknownError, "engine stop",
                                   ["graph.never.joined", "shut down"])
            hvd.shutdown()
        hvd.init()
    got = tf.function(lambda: hvd.allreduce(tf.constant([3.0]), op=hvd.Sum, name="graph.after.restart"))()
    expect_close(got, [3.0 * N], "tf.function allreduce after restarting hvdlite")
