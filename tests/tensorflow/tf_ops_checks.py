"""Every collective of hvdlite.tensorflow, eagerly and inside tf.function, against NumPy
references that each rank computes for all ranks from seeded data; gradients of the
collectives; variables and objects; error paths; DistributedGradientTape against
single-process training on the global batch."""
from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import tensorflow as tf

from tf_checks_common import (MODES, N, R, FAILURES, as_tf, check, data, expect, expect_close,
                              graph_ops_available, hvd, np_data)

@check
def allreduce_ops_and_dtypes():
    shape = (3, 5)
    for mode, wrap in MODES.items():
        for dname in ["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"]:
            is_float = dname in ("float32", "float64", "float16", "bfloat16")
            ops = [(hvd.Sum, "sum"), (hvd.Min, "min"), (hvd.Max, "max")]
            if is_float:
                ops += [(hvd.Average, "avg"), (hvd.Product, "prod")]
            elif dname not in ("int8", "uint8"):
                ops += [(hvd.Product, "prod")]
            small = dname in ("int8", "uint8")
            all_data = [np_data(r, shape, dname, seed=1, low=0 if small else -3, high=1 if small else 3)
                        for r in range(N)]
            x = as_tf(all_data[R].astype(np.float32) if dname == "bfloat16" else all_data[R], dname)
            if dname == "bfloat16":
                x = tf.cast(x, tf.bfloat16)
            for op, label in ops:
                fn = wrap(lambda t, op=op: hvd.allreduce(t, op=op))
                got = fn(x)
                stack = np.stack([a.astype(np.float64) for a in all_data])
                want = {"sum": stack.sum(0), "avg": stack.mean(0), "min": stack.min(0),
                        "max": stack.max(0), "prod": np.prod(stack, 0)}[label]
                tol = 2e-2 if dname in ("float16", "bfloat16") else 1e-5
                if label == "prod" and dname in ("float16", "bfloat16"):
                    tol = 5e-2
                expect(got.dtype == x.dtype, f"{mode} {dname} {label}: dtype {got.dtype}")
                expect_close(np.asarray(got).astype(np.float64), want, f"{mode} allreduce {dname} {label}",
                             rtol=tol, atol=tol)


@check
def allreduce_scaling_variable_and_scalar():
    for mode, wrap in MODES.items():
        a = [data(r, (4,), np.float64, seed=2) for r in range(N)]
        fn = wrap(lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0))
        expect_close(fn(tf.constant(a[R])), 1.5 * np.sum(a, 0), f"{mode} pre/postscale")
        fn = wrap(lambda t: hvd.allreduce(t, average=False))
        expect_close(fn(tf.constant(a[R])), np.sum(a, 0), f"{mode} average=False")
        v = tf.Variable(a[R])
        fn = wrap(lambda: hvd.allreduce(v))
        expect_close(fn(), np.mean(a, 0), f"{mode} allreduce of tf.Variable")
        s = [float(r + 1) for r in range(N)]
        fn = wrap(lambda t: hvd.allreduce(t, op=hvd.Sum))
        got = fn(tf.constant(s[R]))
        expect(got.shape == (), f"{mode} scalar shape {got.shape}")
        expect_close(got, sum(s), f"{mode} scalar allreduce")
        fn = wrap(lambda t: hvd.allreduce(t, name="named_allreduce"))
        expect_close(fn(tf.constant(a[R])), np.mean(a, 0), f"{mode} named allreduce")
        got = wrap(lambda t: hvd.allreduce(t, op=hvd.Sum))(tf.zeros([0, 3]))
        expect(tuple(got.shape) == (0, 3), f"{mode} empty allreduce shape {got.shape}")


@check
def grouped_allreduce_lists():
    for mode, wrap in MODES.items():
        shapes = [(2, 3), (7,), (1, 2, 2), ()]
        per_rank = [[data(r, s, np.float32, seed=3 + i) for i, s in enumerate(shapes)] for r in range(N)]
        fn = wrap(lambda *ts: hvd.grouped_allreduce(list(ts), op=hvd.Sum))
        got = fn(*[tf.constant(t) for t in per_rank[R]])
        expect(len(got) == len(shapes), f"{mode} grouped: {len(got)} results")
        for i in range(len(shapes)):
            expect_close(got[i], np.sum([p[i] for p in per_rank], 0), f"{mode} grouped[{i}]", rtol=1e-5)
        fn = wrap(lambda *ts: hvd.grouped_allreduce(list(ts)))
        got = fn(*[tf.constant(t) for t in per_rank[R]])
        for i in range(len(shapes)):
            expect_close(got[i], np.mean([p[i] for p in per_rank], 0), f"{mode} grouped avg[{i}]", rtol=1e-5)


@check
def allgather_variable_first_dim():
    for mode, wrap in MODES.items():
        for dname in ["float32", "float64", "int32", "int64", "uint8", "float16", "bfloat16"]:
            parts = [np_data(r, (r + 1, 2, 3), dname, seed=4) for r in range(N)]
            x = as_tf(parts[R], dname)
            if dname == "bfloat16":
                x = tf.cast(tf.constant(parts[R]), tf.bfloat16)
            got = wrap(lambda t: hvd.allgather(t))(x)
            expect(got.dtype == x.dtype, f"{mode} allgather {dname} dtype {got.dtype}")
            expect_close(np.asarray(got).astype(np.float64), np.concatenate(parts).astype(np.float64),
                         f"{mode} allgather {dname}")
        # bool and int16 travel as bytes
        b = [data(r, (r + 2, 3), np.bool_, seed=5) for r in range(N)]
        got = wrap(lambda t: hvd.allgather(t))(tf.constant(b[R]))
        expect(got.dtype == tf.bool and np.array_equal(np.asarray(got), np.concatenate(b)),
               f"{mode} allgather bool")
        i16 = [data(r, (2, r + 1), np.int16, seed=6)[:, :1].copy() for r in range(N)]
        got = wrap(lambda t: hvd.allgather(t))(tf.constant(i16[R]))
        expect(np.array_equal(np.asarray(got), np.concatenate(i16)), f"{mode} allgather int16")
        # empty contribution on some ranks
        parts = [np.full((r % 2, 2), r, np.float32) for r in range(N)]
        got = wrap(lambda t: hvd.allgather(t))(tf.constant(parts[R]))
        expect_close(got, np.concatenate(parts), f"{mode} allgather with empty parts")
        gg = wrap(lambda a, c: hvd.grouped_allgather([a, c]))(tf.constant(parts[R]), tf.constant(b[R]))
        expect_close(gg[0], np.concatenate(parts), f"{mode} grouped_allgather[0]")
        expect(np.array_equal(np.asarray(gg[1]), np.concatenate(b)), f"{mode} grouped_allgather[1]")


@check
def broadcast_from_every_root():
    for mode, wrap in MODES.items():
        for root in range(N):
            for dname in ["float32", "int64", "bfloat16", "uint8"]:
                vals = [np_data(r, (3, 2), dname, seed=7) for r in range(N)]
                x = as_tf(vals[R], dname)
                if dname == "bfloat16":
                    x = tf.cast(tf.constant(vals[R]), tf.bfloat16)
                got = wrap(lambda t, root=root: hvd.broadcast(t, root))(x)
                expect(got.dtype == x.dtype, f"{mode} broadcast dtype {dname}")
                expect_close(np.asarray(got).astype(np.float64), vals[root].astype(np.float64),
                             f"{mode} broadcast {dname} root {root}")
        b = [data(r, (5,), np.bool_, seed=8) for r in range(N)]
        got = wrap(lambda t: hvd.broadcast(t, N - 1))(tf.constant(b[R]))
        expect(np.array_equal(np.asarray(got), b[N - 1]), f"{mode} broadcast bool")
        s = [np.float32(r + 0.5) for r in range(N)]
        got = wrap(lambda t: hvd.broadcast(t, N - 1))(tf.constant(s[R]))
        expect_close(got, s[N - 1], f"{mode} broadcast scalar")


def splits_of(r):
    return [(r + d) % 3 + 1 for d in range(N)]


@check
def alltoall_even_and_splits():
    for mode, wrap in MODES.items():
        xs = [data(r, (2 * N, 3), np.float32, seed=9) for r in range(N)]
        got = wrap(lambda t: hvd.alltoall(t))(tf.constant(xs[R]))
        want = np.concatenate([xs[s][2 * R:2 * R + 2] for s in range(N)])
        expect_close(got, want, f"{mode} alltoall even")
        xs = [data(r, (sum(splits_of(r)), 2), np.float64, seed=10) for r in range(N)]
        out, recv = wrap(lambda t, sp: hvd.alltoall(t, splits=sp))(tf.constant(xs[R]),
                                                                   tf.constant(splits_of(R), tf.int32))
        pieces = []
        for s in range(N):
            off = sum(splits_of(s)[:R])
            pieces.append(xs[s][off:off + splits_of(s)[R]])
        expect_close(out, np.concatenate(pieces), f"{mode} alltoall splits")
        expect(list(np.asarray(recv)) == [splits_of(s)[R] for s in range(N)],
               f"{mode} alltoall received splits {np.asarray(recv)}")
        ints = [np.arange(2 * N, dtype=np.int32) + 100 * r for r in range(N)]
        got = wrap(lambda t: hvd.alltoall(t))(tf.constant(ints[R]))
        expect(np.array_equal(np.asarray(got), np.concatenate([ints[s][2 * R:2 * R + 2] for s in range(N)])),
               f"{mode} alltoall int32")
        # Rank 0 sends nothing, others r+1 rows of 2 to every rank (as in Horovod's test),
        # in a dtype the engine moves as bytes too: rows of width 0 would not match.
        for dt in (np.float32, np.uint16):
            sp = [0] * N if R == 0 else [R + 1] * N
            x = np.concatenate([np.full((c, 2), 10 * R + d, dt) for d, c in enumerate(sp)]) if R else np.zeros((0, 2), dt)
            out, recv = wrap(lambda t, s: hvd.alltoall(t, splits=s))(tf.constant(x), tf.constant(sp, tf.int32))
            want = np.concatenate([np.full((0 if s == 0 else s + 1, 2), 10 * s + R, dt) for s in range(N)])
            expect(np.array_equal(np.asarray(out), want) and np.asarray(out).dtype == dt,
                   f"{mode} alltoall {np.dtype(dt).name}, rank 0 sending nothing: {np.asarray(out)}")
            expect(list(np.asarray(recv)) == [0 if s == 0 else s + 1 for s in range(N)],
                   f"{mode} alltoall received splits {np.asarray(recv)}")


@check
def reducescatter_uneven():
    for mode, wrap in MODES.items():
        rows = 2 * N + 1
        xs = [data(r, (rows, 3), np.float32, seed=11) for r in range(N)]
        base, extra = divmod(rows, N)
        counts = [base + (1 if r < extra else 0) for r in range(N)]
        start = sum(counts[:R])
        for op, red in [(hvd.Sum, np.sum), (hvd.Average, np.mean)]:
            got = wrap(lambda t, op=op: hvd.reducescatter(t, op=op))(tf.constant(xs[R]))
            expect_close(got, red(xs, 0)[start:start + counts[R]], f"{mode} reducescatter op {op}", rtol=1e-5)
        got = wrap(lambda a, b: hvd.grouped_reducescatter([a, b], op=hvd.Sum))(tf.constant(xs[R]),
                                                                             tf.constant(xs[R] * 2))
        expect_close(got[1], 2 * np.sum(xs, 0)[start:start + counts[R]], f"{mode} grouped_reducescatter",
                     rtol=1e-5)


@check
def barrier_and_join():
    for mode, wrap in MODES.items():
        wrap(lambda: hvd.barrier())()
        # Every rank but the last joins at once; the last one still runs an allreduce,
        # to which the joined ranks contribute nothing, then joins last.
        if R == N - 1:
            got = wrap(lambda t: hvd.allreduce(t, op=hvd.Sum, name=f"after_join_{mode}"))(tf.ones([3]))
            expect_close(got, np.ones(3), f"{mode} allreduce while the other ranks have joined")
        last = wrap(lambda: hvd.join())()
        expect(int(last) == N - 1, f"{mode} join returned {int(last)}, expected {N - 1}")
        got = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)
        expect_close(got, [float(N)], f"{mode} allreduce after join")
    expect(int(hvd.size_op()) == N and int(hvd.rank_op()) == R, "size_op/rank_op")
    expect(int(hvd.process_set_included_op()) == 1, "process_set_included_op")
    for op in (hvd.size_op, hvd.process_set_included_op):
        try:
            op(process_set_id=1)
            FAILURES.append(f"{op.__name__}(process_set_id=1) did not raise")
        except ValueError as e:  # no set 1 is registered in this job
            expect("not registered" in str(e), f"{op.__name__}: {e}")


def upstream(r, shape, seed):
    return data(r, shape, np.float64, seed=seed)


@check
def gradients_of_collectives():
    for mode, wrap in MODES.items():
        x_all = [data(r, (r + 1, 3), np.float64, seed=12) for r in range(N)]
        total = sum(r + 1 for r in range(N))
        w_all = [upstream(r, (total, 3), 13) for r in range(N)]

        def ag_grad(x, w):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(hvd.allgather(x) * w)
            return tape.gradient(loss, x)
        g = wrap(ag_grad)(tf.constant(x_all[R]), tf.constant(w_all[R]))
        off = sum(r + 1 for r in range(R))
        expect_close(g, np.mean(w_all, 0)[off:off + R + 1], f"{mode} allgather gradient")

        # Grouped, with a second tensor whose row counts run the other way (N - r rows).
        z_all = [data(r, (N - r, 2), np.float64, seed=22) for r in range(N)]
        v_all = [upstream(r, (total, 2), 23) for r in range(N)]

        def gag_grad(x, z, w, v):
            with tf.GradientTape() as tape:
                tape.watch([x, z])
                a, b = hvd.grouped_allgather([x, z])
                loss = tf.reduce_sum(a * w) + tf.reduce_sum(b * v)
            return tape.gradient(loss, [x, z])
        gx, gz = wrap(gag_grad)(tf.constant(x_all[R]), tf.constant(z_all[R]),
                                tf.constant(w_all[R]), tf.constant(v_all[R]))
        off_z = sum(N - r for r in range(R))
        expect_close(gx, np.mean(w_all, 0)[off:off + R + 1], f"{mode} grouped_allgather gradient 0")
        expect_close(gz, np.mean(v_all, 0)[off_z:off_z + N - R], f"{mode} grouped_allgather gradient 1")

        w3 = [upstream(r, (2, 3), 14) for r in range(N)]
        x3 = [data(r, (2, 3), np.float64, seed=15) for r in range(N)]
        for op, red in [(hvd.Sum, np.sum), (hvd.Average, np.mean)]:
            def ar_grad(x, w, op=op):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    loss = tf.reduce_sum(hvd.allreduce(x, op=op) * w)
                return tape.gradient(loss, x)
            g = wrap(ar_grad)(tf.constant(x3[R]), tf.constant(w3[R]))
            expect_close(g, red(w3, 0), f"{mode} allreduce gradient op {op}")

        root = N - 1

        def bc_grad(x, w):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(hvd.broadcast(x, root) * w)
            return tape.gradient(loss, x)
        g = wrap(bc_grad)(tf.constant(x3[R]), tf.constant(w3[R]))
        expect_close(g, np.mean(w3, 0) if R == root else np.zeros((2, 3)), f"{mode} broadcast gradient")

        def ga_grad(a, b, wa, wb):
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                ya, yb = hvd.grouped_allreduce([a, b], op=hvd.Sum)
                loss = tf.reduce_sum(ya * wa) + tf.reduce_sum(yb * wb)
            return tape.gradient(loss, [a, b])
        ga, gb = wrap(ga_grad)(tf.constant(x3[R]), tf.constant(x3[R][0]), tf.constant(w3[R]),
                               tf.constant(w3[R][1]))
        expect_close(ga, np.sum(w3, 0), f"{mode} grouped_allreduce gradient[0]")
        expect_close(gb, np.sum([w[1] for w in w3], 0), f"{mode} grouped_allreduce gradient[1]")

        # alltoall: the gradient is the reverse alltoall of the upstream gradient
        xs = [data(r, (sum(splits_of(r)), 2), np.float64, seed=16) for r in range(N)]
        recv_rows = [sum(splits_of(s)[r] for s in range(N)) for r in range(N)]
        ws = [upstream(r, (recv_rows[r], 2), 17) for r in range(N)]

        def a2a_grad(x, w, sp):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y, _ = hvd.alltoall(x, splits=sp)
                loss = tf.reduce_sum(y * w)
            return tape.gradient(loss, x)
        g = wrap(a2a_grad)(tf.constant(xs[R]), tf.constant(ws[R]), tf.constant(splits_of(R), tf.int32))
        # rank R's rows sent to rank d come back as the part of ws[d] that came from R
        want = []
        for d in range(N):
            off = sum(splits_of(s)[d] for s in range(R))
            want.append(ws[d][off:off + splits_of(R)[d]])
        expect_close(g, np.concatenate(want), f"{mode} alltoall gradient")

        rows = 2 * N + 1
        xr = [data(r, (rows, 2), np.float64, seed=18) for r in range(N)]
        base, extra = divmod(rows, N)
        counts = [base + (1 if r < extra else 0) for r in range(N)]
        wr = [upstream(r, (counts[r], 2), 19) for r in range(N)]

        def rs_grad(x, w):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(hvd.reducescatter(x, op=hvd.Sum) * w)
            return tape.gradient(loss, x)
        g = wrap(rs_grad)(tf.constant(xr[R]), tf.constant(wr[R]))
        # Horovod's convention: Sum's gradient is the gathered gradient times the ranks.
        expect_close(g, np.concatenate(wr) * N, f"{mode} reducescatter gradient")

        # Grouped, Average with a prescale: each input's gradient is its own output's
        # gradient gathered from every rank, times the prescale (Horovod's convention).
        xq = [data(r, (N, 3), np.float64, seed=20) for r in range(N)]
        wq = [upstream(r, (1, 3), 21) for r in range(N)]

        def grs_grad(x, z, w, v):
            with tf.GradientTape() as tape:
                tape.watch([x, z])
                a, b = hvd.grouped_reducescatter([x, z], op=hvd.Average, prescale_factor=2.0)
                loss = tf.reduce_sum(a * w) + tf.reduce_sum(b * v)
            return tape.gradient(loss, [x, z])
        gx, gz = wrap(grs_grad)(tf.constant(xr[R]), tf.constant(xq[R]), tf.constant(wr[R]),
                                tf.constant(wq[R]))
        expect_close(gx, np.concatenate(wr) * 2, f"{mode} grouped_reducescatter gradient 0")
        expect_close(gz, np.concatenate(wq) * 2, f"{mode} grouped_reducescatter gradient 1")


@check
def indexed_slices_and_compression():
    for mode, wrap in MODES.items():
        vals = [data(r, (r + 1, 4), np.float32, seed=20) for r in range(N)]
        idx = [np.arange(r + 1, dtype=np.int64) % 3 + r for r in range(N)]

        def sparse_reduce(v, i):
            s = tf.IndexedSlices(v, i, dense_shape=tf.constant([N + 3, 4], tf.int64))
            out = hvd.allreduce(s)
            return out.values, out.indices
        v, i = wrap(sparse_reduce)(tf.constant(vals[R]), tf.constant(idx[R]))
        expect_close(v, np.concatenate(vals) / N, f"{mode} IndexedSlices values (Average)")
        expect(np.array_equal(np.asarray(i), np.concatenate(idx)), f"{mode} IndexedSlices indices")
        # Integer values average with true division, as Horovod: floats, not zeros.
        iv = wrap(lambda: hvd.allreduce(tf.IndexedSlices(tf.constant([[7, 8]], tf.int32), tf.constant([R], tf.int64),
                                                         dense_shape=tf.constant([N, 2], tf.int64))).values)()
        expect(iv.dtype == tf.float64, f"{mode} int32 IndexedSlices Average gives float64, not {iv.dtype}")
        expect_close(iv, np.tile([[7 / N, 8 / N]], (N, 1)), f"{mode} int32 IndexedSlices Average")
        # Other ops and scale factors are refused with NotImplementedError, as Horovod; in
        # a graph when it is built (traced here, never run).
        for what, kwargs in [("Min", {"op": hvd.Min}), ("Adasum", {"op": hvd.Adasum}),
                             ("prescale_factor", {"op": hvd.Sum, "prescale_factor": 0.5}),
                             ("postscale_factor", {"postscale_factor": 2.0})]:
            def refused(kwargs=kwargs):
                return hvd.allreduce(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([R], tf.int64),
                                                      dense_shape=tf.constant([N, 2], tf.int64)), **kwargs).values
            try:
                refused() if mode == "eager" else tf.function(refused).get_concrete_function()
                FAILURES.append(f"{mode} IndexedSlices allreduce with {what}: rank {R} raised nothing")
            except NotImplementedError as e:
                expect("IndexedSlices" in str(e), f"{mode} IndexedSlices with {what}: error says {e}")
        x = [data(r, (64,), np.float32, seed=21) for r in range(N)]
        for comp, tol in [(hvd.Compression.fp16, 1e-2), (hvd.Compression.bf16, 5e-2), (hvd.Compression.none, 1e-6)]:
            got = wrap(lambda t, comp=comp: hvd.allreduce(t, compression=comp))(tf.constant(x[R]))
            expect(got.dtype == tf.float32, f"{mode} compression keeps dtype")
            expect_close(got, np.mean(x, 0), f"{mode} compression {comp.__name__}", rtol=tol, atol=tol)


@check
def variables_and_objects():
    vs = [tf.Variable(data(R, (3, 2), np.float32, seed=22)), tf.Variable(np.int64(R + 7))]
    hvd.broadcast_variables(vs, root_rank=N - 1)
    expect_close(vs[0], data(N - 1, (3, 2), np.float32, seed=22), "broadcast_variables float")
    expect(int(vs[1].numpy()) == N - 1 + 7, "broadcast_variables int")
    v2 = tf.Variable(data(R, (4,), np.float64, seed=23))

    @tf.function
    def bcast_in_graph():
        hvd.broadcast_variables([v2], root_rank=0)
        return v2.read_value()
    expect_close(bcast_in_graph(), data(0, (4,), np.float64, seed=23), "broadcast_variables in tf.function")
    obj = hvd.broadcast_object({"rank": R, "list": list(range(R + 1)), "f": (lambda z: z + R)}, root_rank=N - 1)
    expect(obj["rank"] == N - 1 and obj["list"] == list(range(N)) and obj["f"](1) == N,
           f"broadcast_object {obj['rank']}")
    gathered = hvd.allgather_object({"r": R, "s": "x" * R})
    expect(gathered == [{"r": r, "s": "x" * r} for r in range(N)], f"allgather_object {gathered}")


def expect_failed_precondition(e, what):
    """Eagerly a failed collective is Horovod's FailedPreconditionError and an HvdliteError."""
    expect(isinstance(e, tf.errors.FailedPreconditionError) and isinstance(e, hvd.HvdliteError)
           and e.error_code == tf.errors.FAILED_PRECONDITION,
           f"{what}: raised {type(e).__mro__}, not FailedPreconditionError + HvdliteError")


@check
def errors_are_raised_and_recoverable():
    # Shape mismatch: every rank must get an error naming the tensor.
    if N > 1:
        try:
            hvd.allreduce(tf.ones([R + 1]), name="mismatched_shape")
            FAILURES.append("mismatched allreduce did not raise")
        except tf.errors.OpError as e:
            expect("mismatched_shape" in str(e), f"error message does not name the tensor: {e}")
            expect_failed_precondition(e, "eager shape mismatch")

        @tf.function
        def bad_in_graph(x):
            return hvd.allreduce(x, name="mismatched_in_graph")
        try:
            bad_in_graph(tf.ones([R + 2]))
            FAILURES.append("mismatched allreduce in tf.function did not raise")
        except tf.errors.OpError as e:  # hvdlite's graph op fails with Horovod's code
            want = tf.errors.FailedPreconditionError if graph_ops_available() else tf.errors.UnknownError
            expect(isinstance(e, want), f"graph shape mismatch raised {type(e).__mro__[:2]}, not {want.__name__}")
            expect("mismatched_in_graph" in str(e) and f"rank {N - 1}" in str(e),
                   f"graph error does not name the tensor and the ranks: {str(e)[:300]}")
    try:
        hvd.allreduce(tf.constant([True, False]))
        FAILURES.append("allreduce of bool did not raise")
    except tf.errors.OpError as e:
        expect("bool" in str(e), f"bool error message: {e}")
        expect_failed_precondition(e, "allreduce of bool")
    try:
        tf.function(lambda t: hvd.allreduce(t), jit_compile=True)(tf.ones([2]))
        FAILURES.append("allreduce under jit_compile=True did not raise")
    except Exception as e:  # autograph re-raises it as a StagingError carrying the message
        expect("jit_compile" in str(e), f"XLA error message: {str(e)[:300]}")
    got = hvd.allreduce(tf.constant([2.0]), op=hvd.Sum)
    expect_close(got, [2.0 * N], "allreduce after errors")


# The tf.errors class of a collective refused on the rank that refused it, by the
# Python type of its problem (Horovod: InvalidArgumentError for a bad value); every
# other rank's collective failed because of that rank: FailedPreconditionError.
REFUSED_ERROR = {ValueError: tf.errors.InvalidArgumentError, TypeError: tf.errors.InvalidArgumentError,
                 NotImplementedError: tf.errors.UnimplementedError, None: tf.errors.FailedPreconditionError}


def expect_refused_everywhere(mode, what, fn, needles, bad_type=None):
    """`fn` fails on every rank, naming the last rank (which passed the bad input) and
    the problem, with FailedPreconditionError; on the bad rank with the error of
    REFUSED_ERROR for `bad_type`, eagerly also an instance of `bad_type`. Eagerly every
    error is also an HvdliteError. The next collectives, named and unnamed, still work."""
    bad = N - 1
    try:
        fn()
        FAILURES.append(f"{mode} {what}: rank {R} raised nothing")
    except Exception as e:  # in a graph, TensorFlow raises its own OpError class
        msg = str(e)
        expect(f"rank {bad}: " in msg, f"{mode} {what}: error does not name rank {bad}: {msg[:400]}")
        for needle in needles:
            expect(needle in msg, f"{mode} {what}: {needle!r} missing from the error: {msg[:400]}")
        want = REFUSED_ERROR[bad_type if R == bad else None]
        if mode != "eager" and not graph_ops_available():
            want = tf.errors.OpError  # the py_function fallback cannot choose the code
        expect(isinstance(e, want), f"{mode} {what}: raised {type(e).__mro__[:3]}, not {want.__name__}")
        if mode == "eager":
            expect(isinstance(e, hvd.HvdliteError), f"{what}: raised {type(e).__mro__}, not an HvdliteError")
            if R == bad and bad_type is not None:
                expect(isinstance(e, bad_type), f"{what}: raised {type(e).__mro__}, not {bad_type}")
    got = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name=f"after.{mode}.{what}")
    expect_close(got, [float(N)], f"{mode} named allreduce after {what}")
    got = hvd.allreduce(tf.constant([float(R)]), op=hvd.Sum)
    expect_close(got, [float(sum(range(N)))], f"{mode} unnamed allreduce after {what}")


@check
def unforeseen_staging_failure_fails_on_every_rank():
    """A failure while one rank prepares an eager request, of a kind the checks made
    before submitting did not foresee (planted here), is refused on every rank rather
    than raised on that rank alone while the others wait."""
    if N == 1:
        return
    from hvdlite.tensorflow import eager as _tf_ops
    real = _tf_ops._rows_as_bytes

    def planted(arr):
        raise ValueError("planted staging failure")
    if R == N - 1:
        _tf_ops._rows_as_bytes = planted
    try:
        x = tf.constant(np.full((2, 3), R, np.uint16))  # uint16 rows travel as bytes
        expect_refused_everywhere("eager", "allgather whose staging failed on one rank",
                                  lambda: hvd.allgather(x, name="planted.staging"),
                                  ("planted staging failure",), bad_type=ValueError)
    finally:
        _tf_ops._rows_as_bytes = real


@check
def input_one_rank_cannot_use_fails_on_every_rank():
    """The last rank passes input that it alone cannot use; the collective fails on every
    rank instead of leaving the others waiting for it (see expect_refused_everywhere)."""
    if N == 1:
        return
    bad = R == N - 1
    for mode, wrap in MODES.items():
        x = tf.constant([True, False]) if bad else tf.constant([1.0, 2.0])
        expect_refused_everywhere(mode, "allreduce of bool", wrap(lambda: hvd.allreduce(x, op=hvd.Sum)),
                                  ("dtype bool cannot be reduced",))
        members = [tf.ones([2]), tf.constant([True]) if bad else tf.ones([1])]
        expect_refused_everywhere(mode, "grouped_allreduce with a bool member",
                                  wrap(lambda: hvd.grouped_allreduce(members, op=hvd.Sum)),
                                  ("bool cannot be reduced",))
        g = tf.constant(1.0) if bad else tf.ones([2])
        expect_refused_everywhere(mode, "allgather of a scalar", wrap(lambda: hvd.allgather(g)),
                                  ("needs a tensor of rank >= 1",))
        rs_op = hvd.Max if bad else hvd.Sum
        expect_refused_everywhere(mode, "reducescatter with Max",
                                  wrap(lambda: hvd.reducescatter(tf.ones([N, 2]), op=rs_op)),
                                  ("only Sum and Average", "Max"), NotImplementedError)
        sparse_op = hvd.Max if bad else hvd.Sum

        def sparse_allreduce():
            s = hvd.allreduce(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([R], tf.int64),
                                               dense_shape=tf.constant([N, 2], tf.int64)), op=sparse_op)
            return s.values
        expect_refused_everywhere(mode, "IndexedSlices allreduce with Max", wrap(sparse_allreduce),
                                  ("IndexedSlices", "Max"), NotImplementedError)
    # Eagerly only: in a graph the splits below are refused when the graph is traced.
    splits = ["two"] * N if bad else [1] * N
    expect_refused_everywhere("eager", "alltoall with splits that are not integers",
                              lambda: hvd.alltoall(tf.ones([N, 2]), splits=splits),
                              ("splits must be integers",), ValueError)


@check
def engine_stop_fails_collectives_in_flight_with_unknown_error():
    """Rank 0 shuts down while the other ranks wait in an allreduce it never joins: their
    allreduce fails with tf.errors.UnknownError (Horovod's code for a stopped job), which
    is also an HvdliteError naming the reason. Every rank then starts hvdlite again."""
    if N > 1:
        if R == 0:
            time.sleep(1.0)  # the others' allreduce is in flight by then
            hvd.shutdown()
        else:
            try:
                hvd.allreduce(tf.ones([2]), name="never.joined.by.rank0")
                FAILURES.append("allreduce in flight at rank 0's shutdown did not raise")
            except tf.errors.OpError as e:
                expect(isinstance(e, tf.errors.UnknownError) and isinstance(e, hvd.HvdliteError),
                       f"raised {type(e).__mro__}, not UnknownError + HvdliteError")
                expect("never.joined.by.rank0" in str(e) and "shut down" in str(e),
                       f"error does not name the tensor and the shutdown: {e}")
            hvd.shutdown()
        hvd.init()
    got = hvd.allreduce(tf.constant([3.0]), op=hvd.Sum, name="after.restart")
    expect_close(got, [3.0 * N], "allreduce after restarting hvdlite")


@check
def gradient_tape_rejects_unsupported_ops():
    """An op that is not Average/Sum/Adasum/Min/Max/Product is refused when the tape is
    wrapped, with a message naming it, not at the first gradient() call."""
    v = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * v)
    try:
        hvd.DistributedGradientTape(tape, op=17)
        FAILURES.append("DistributedGradientTape(op=17) did not raise")
    except ValueError as e:
        expect("17" in str(e), f"op=17 error message does not name it: {e}")
    for op in (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * v)
        grads = hvd.DistributedGradientTape(tape, op=op).gradient(loss, [v])
        g = np.array([2.0, 4.0])  # the same on every rank
        want = {hvd.Sum: g * N, hvd.Product: g ** N}.get(op, g)
        expect_close(grads[0], want, f"tape gradient with op={op}")


@contextlib.contextmanager
def environment(values):
    """Set environment variables for the duration, then restore what was there."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@check
def distributed_gradient_tape_matches_single_process():
    """k steps of a custom tf.function loop on rank-local batches == single-process
    training on the global batch, for several tape options."""
    B, D, H, K = 4, 5, 6, 3
    rng = np.random.default_rng(99)
    X = rng.normal(size=(K * B * N, D)).astype(np.float32)
    Y = rng.normal(size=(K * B * N, 2)).astype(np.float32)
    w_init = [rng.normal(size=(D, H)).astype(np.float32) * 0.5, np.zeros(H, np.float32),
              rng.normal(size=(H, 2)).astype(np.float32) * 0.5]

    def forward(w, x):
        return tf.matmul(tf.nn.relu(tf.matmul(x, w[0]) + w[1]), w[2])

    unused = tf.Variable(np.ones(2, np.float32))

    def train(options, distributed):
        # every rank starts from a different point; the broadcast fixes that
        w = [tf.Variable(a + (0.1 * R if distributed else 0.0)) for a in w_init]
        if callable(options):
            options = options(w)
        wrap_first = bool(options.pop("wrap_first", False)) if distributed else False
        if distributed:
            hvd.broadcast_variables(w, root_rank=0)

        @tf.function
        def step(x, y):
            if wrap_first:  # wrapping the tape before recording works too
                with hvd.DistributedGradientTape(tf.GradientTape(), **options) as tape:
                    loss = tf.reduce_mean((forward(w, x) - y) ** 2)
            else:
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((forward(w, x) - y) ** 2)
                if distributed:
                    tape = hvd.DistributedGradientTape(tape, **options)
            grads = tape.gradient(loss, w + [unused])
            tf.debugging.assert_equal(grads[-1] is None, True)  # unconnected stays None
            for v, g in zip(w, grads):
                v.assign_sub(0.1 * g)
            return loss
        for k in range(K):
            g0 = k * B * N
            if distributed:
                step(X[g0 + R * B:g0 + (R + 1) * B], Y[g0 + R * B:g0 + (R + 1) * B])
            else:
                step(X[g0:g0 + B * N], Y[g0:g0 + B * N])
        return [v.numpy() for v in w]

    reference = train({}, distributed=False)
    variants = {"default": {}, "groups": {"num_groups": 2}, "predivide": {"gradient_predivide_factor": 2.0},
                "var_groups": lambda w: {"groups": [[w[0], w[2]]]},
                "fp16": {"compression": hvd.Compression.fp16}, "wrap_first": {"wrap_first": True},
                "one_batch": {}, "small_buckets": {}}
    settings = {"one_batch": {"HVDLITE_TF_BUCKET_BYTES": "0"},  # the whole step in one submit
                # one submit op per gradient, where TensorFlow runs it / during the backward pass
                "small_buckets": {"HVDLITE_TF_BUCKET_BYTES": "8", "HVDLITE_TF_OVERLAP": "0"},
                "small_buckets_overlap": {"HVDLITE_TF_BUCKET_BYTES": "8", "HVDLITE_TF_OVERLAP": "1"},
                "groups_overlap": {"HVDLITE_TF_BUCKET_BYTES": "8", "HVDLITE_TF_OVERLAP": "1"}}
    variants["small_buckets_overlap"] = {}
    variants["groups_overlap"] = {"num_groups": 2}
    for label, options in variants.items():
        with environment(settings.get(label, {})):
            got = train(dict(options) if isinstance(options, dict) else options, distributed=True)
        tol = 2e-3 if label == "fp16" else 1e-5
        for i, (g, r) in enumerate(zip(got, reference)):
            expect_close(g, r, f"tape {label} weight {i} vs single process", rtol=tol, atol=tol)
            everyone = hvd.allgather(tf.constant(g[None]))
            expect(np.allclose(np.asarray(everyone), g[None], rtol=1e-6, atol=1e-7),
                   f"tape {label} weight {i} differs between ranks")


@check
def gradient_buckets_are_submitted_during_the_backward_pass():
    """With HVDLITE_TF_OVERLAP=1, inside tf.function (custom loop and Keras fit), each
    bucket of gradients is submitted before the backward pass goes on to the layers
    below it. Every layer's input passes through an op whose gradient runs a Python
    marker, a stateful op that TensorFlow chains with other stateful ops in program
    order; the order in which markers and submits run is recorded. The weights after
    one step equal an SGD step on the average of every rank's own gradients; with the
    overlap off they are the same. Traced as if TensorFlow had several inter-op threads,
    the submits gate nothing in the backward pass and follow no marker."""
    import keras

    import hvdlite.tensorflow.keras as hvdk
    from hvdlite.tensorflow import _kernels, graph

    L, D, B_ = 4, 6, 5
    rng = np.random.default_rng(77)
    w_init = [rng.normal(size=(D, D)).astype(np.float32) * 0.5 for _ in range(L)]
    x = data(R, (B_, D), np.float32, seed=78)
    events = []

    def marker(i):
        def record(dy):
            events.append((time.monotonic_ns(), f"layer {i}"))
            return dy

        @tf.custom_gradient
        def mark(h):
            def grad(dy):
                out = tf.py_function(record, [dy], dy.dtype)
                out.set_shape(dy.shape)
                return out
            return tf.identity(h), grad
        return mark

    marks = [marker(i) for i in range(L)]
    real_submit = graph._submit

    def recording_submit(specs, *args, **kwargs):  # the py_function fallback's submits
        events.append((time.monotonic_ns(), "submit " + ",".join(sp.name.rsplit(".", 1)[-1] for sp in specs)))
        return real_submit(specs, *args, **kwargs)

    def ordered_events():
        """Markers and submits in the order they ran. hvdlite's graph ops record their
        submits in C++, with the clock of time.monotonic_ns()."""
        submits = [(ns, "submit " + ",".join(n.rsplit(".", 1)[-1] for n in names))
                   for ns, names in _kernels.take_submit_trace()]
        return [e for _, e in sorted(events + submits)]

    def forward(ws, h):
        for i, w in enumerate(ws):
            h = tf.nn.relu(tf.matmul(marks[i](h), w)) if i < L - 1 else tf.matmul(marks[i](h), w)
        return tf.reduce_mean(h ** 2)

    # Reference: the average of every rank's own gradients at the common start.
    ws0 = [tf.Variable(w) for w in w_init]
    with tf.GradientTape() as tape:
        loss = forward(ws0, x)
    mine = [g.numpy() for g in tape.gradient(loss, ws0)]
    mean = [np.mean([e[i] for e in hvd.allgather_object(mine)], axis=0) for i in range(L)]
    want = [w - 0.1 * g for w, g in zip(w_init, mean)]

    def check_order(what):
        # variable i's gradient is submitted before the marker of layer i (which the
        # gradients of the layers below it need) runs
        events = ordered_events()
        for i in range(1, L):
            sub = [k for k, e in enumerate(events) if e.startswith("submit") and str(i) in e.split(" ")[1].split(",")]
            mark = [k for k, e in enumerate(events) if e == f"layer {i}"]
            expect(bool(sub) and bool(mark) and sub[0] < mark[0],
                   f"{what}: gradient {i} submitted after the backward pass reached layer {i}: {events}")

    def loop_step(overlap, inter_op_threads=None):
        ws = [tf.Variable(w) for w in w_init]

        @tf.function
        def step(xb):
            with tf.GradientTape() as tape:
                loss = forward(ws, xb)
            grads = hvd.DistributedGradientTape(tape).gradient(loss, ws)
            for w, g in zip(ws, grads):
                w.assign_sub(0.1 * g)
            return loss
        threading = tf.config.threading
        real_threads = threading.get_inter_op_parallelism_threads
        if inter_op_threads is not None:  # trace as if TensorFlow had more inter-op threads
            threading.get_inter_op_parallelism_threads = lambda: inter_op_threads
        try:
            with environment({"HVDLITE_TF_BUCKET_BYTES": "8", "HVDLITE_TF_OVERLAP": overlap}):
                traced = step.get_concrete_function(tf.TensorSpec(x.shape, tf.float32))
        finally:
            threading.get_inter_op_parallelism_threads = real_threads
        if inter_op_threads is not None and N > 1:
            # no edges into the backward pass; the submits follow no marker (stateful op)
            graph_ops = traced.graph.get_operations()
            # hvdlite's graph ops, or where they cannot be built the py_function fallback
            submit_type, wait_type = (("HvdliteSubmit", "HvdliteWait") if _kernels.library() is not None
                                      else ("EagerPyFunc", "EagerPyFunc"))
            submits = [op for op in graph_ops
                       if op.name.startswith("hvdlite_submit") and op.type == submit_type]
            expect(len(submits) == L, f"{len(submits)} submit ops, expected {L}")
            for op in submits:
                users = ({c.type for c in graph_ops if op in c.control_inputs}
                         | {c.type for o in op.outputs for c in o.consumers()})
                expect(users <= {submit_type, wait_type, "NoOp"},
                       f"with {inter_op_threads} inter-op threads, {op.name} gates {users}")
                waits_for = [c.name for c in op.control_inputs if not c.name.startswith("hvdlite_submit")]
                expect(not waits_for, f"{op.name} waits for {waits_for}")
        events.clear()
        _kernels.take_submit_trace()
        step(tf.constant(x))
        return [w.numpy() for w in ws]

    def fit_step(overlap):
        keras.utils.set_random_seed(5)
        inp = keras.Input((D,))
        h = inp
        for i in range(L):
            h = keras.layers.Lambda(marks[i])(h)
            h = keras.layers.Dense(D, use_bias=False, activation="relu" if i < L - 1 else None)(h)
        model = keras.Model(inp, h)
        model.set_weights(w_init)
        opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1))
        model.compile(optimizer=opt, loss=lambda y, p: tf.reduce_mean(p ** 2, axis=-1))
        with environment({"HVDLITE_TF_BUCKET_BYTES": "8", "HVDLITE_TF_OVERLAP": overlap}):
            events.clear()
            _kernels.take_submit_trace()
            model.fit(x, np.zeros((B_, D), np.float32), batch_size=B_, shuffle=False, verbose=0)
        return model.get_weights()

    graph._submit = recording_submit
    _kernels.trace_submits(True)
    try:
        for overlap in ("1", "0", "more threads"):
            for what, run in (("custom loop", loop_step), ("fit", fit_step)):
                if overlap == "more threads":
                    if what == "fit":
                        continue
                    got = loop_step("1", inter_op_threads=4)
                else:
                    got = run(overlap)
                label = f"{what}, overlap {overlap}"
                for i, (g, w) in enumerate(zip(got, want)):
                    expect_close(g, w, f"{label}: weight {i} vs SGD on the averaged gradients",
                                 rtol=1e-5, atol=1e-6)
                if overlap == "1" and N > 1:
                    check_order(label)
    finally:
        graph._submit = real_submit
        _kernels.trace_submits(False)


@check
def embedding_indexed_slices_gradients():
    """An embedding gradient is tf.IndexedSlices: allgathered by default, densified with
    sparse_as_dense; both give the single-process gradient of the global batch."""
    V, E = 7, 3
    emb0 = data(0, (V, E), np.float32, seed=30)
    ids = [np.array([(r * 2 + j) % V for j in range(3)], np.int64) for r in range(N)]
    ws = [data(r, (3, E), np.float32, seed=31) for r in range(N)]
    emb = tf.Variable(emb0)

    def grad_of(sparse_as_dense, mode_wrap):
        def f(i, w):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.gather(emb, i) * w)
            tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
            g = tape.gradient(loss, emb)
            return tf.convert_to_tensor(g), isinstance(g, tf.IndexedSlices)
        return mode_wrap(f)(tf.constant(ids[R]), tf.constant(ws[R]))

    want = np.zeros((V, E))
    for r in range(N):
        np.add.at(want, ids[r], ws[r])
    want /= N
    for mode, wrap in MODES.items():
        for sad in (False, True):
            g, was_sparse = grad_of(sad, wrap)
            expect_close(g, want, f"{mode} embedding grad sparse_as_dense={sad}", rtol=1e-5)
            if mode == "eager":
                expect(bool(was_sparse) == (not sad), f"embedding gradient type sparse_as_dense={sad}")


@check
def local_sources_keep_their_gradients():
    """tape.register_local_source(v) and PartialDistributedGradientTape(local_layers=...):
    the gradients of local variables are not combined over ranks, only divided by the
    number of ranks (unless scale_local_gradients=False); the others are averaged."""
    import keras

    x = float(R + 1)
    mean_x = np.mean([r + 1.0 for r in range(N)])
    for scale in (True, False):
        for mode, wrap in MODES.items():
            shared = tf.Variable([1.0, 2.0])
            local = tf.Variable([3.0, 4.0])
            emb = tf.Variable(np.ones((4, 2), np.float32))

            def f():
                with tf.GradientTape() as tape:
                    loss = (tf.reduce_sum(shared * x) + tf.reduce_sum(local * 2.0 * x)
                            + tf.reduce_sum(tf.gather(emb, [R % 4]) * x))
                tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale)
                tape.register_local_source(local)
                tape.register_local_source(emb)
                gs, gl, ge = tape.gradient(loss, [shared, local, emb])
                return gs, gl, tf.convert_to_tensor(ge), isinstance(ge, tf.IndexedSlices)

            gs, gl, ge, sparse = wrap(f)()
            div = N if scale else 1
            want_emb = np.zeros((4, 2))
            want_emb[R % 4] = x / div
            expect_close(gs, [mean_x, mean_x], f"{mode} scale={scale}: shared gradient")
            expect_close(gl, [2.0 * x / div] * 2, f"{mode} scale={scale}: local gradient")
            expect_close(ge, want_emb, f"{mode} scale={scale}: local embedding gradient")
            expect(bool(sparse), f"{mode}: a local IndexedSlices gradient stays IndexedSlices")

    # Horovod's get_local_and_global_gradients: the same gradients, split by kind of source.
    shared, local = tf.Variable([1.0, 2.0]), tf.Variable([3.0, 4.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared * x) + tf.reduce_sum(local * 2.0 * x)
    tape = hvd.DistributedGradientTape(tape)
    tape.register_local_source(local)
    local_pairs, global_pairs = tape.get_local_and_global_gradients(loss, [shared, local])
    expect([v is local for v, _ in local_pairs] == [True], "get_local_and_global_gradients: local sources")
    expect([v is shared for v, _ in global_pairs] == [True], "get_local_and_global_gradients: global sources")
    expect_close(local_pairs[0][1], [2.0 * x / N] * 2, "get_local_and_global_gradients: local gradient")
    expect_close(global_pairs[0][1], [mean_x, mean_x], "get_local_and_global_gradients: global gradient")

    # PartialDistributedGradientTape: the weights of the local layers stay local
    keras.utils.set_random_seed(7)
    first, second = keras.layers.Dense(3), keras.layers.Dense(2)
    model = keras.Sequential([keras.Input((4,)), first, second])
    xb = data(R, (5, 4), np.float32, seed=40)

    def loss_of():
        return tf.reduce_mean(model(xb) ** 2)

    with tf.GradientTape() as plain:
        loss = loss_of()
    mine = [g.numpy() for g in plain.gradient(loss, model.trainable_variables)]
    everyone = hvd.allgather_object(mine)
    with tf.GradientTape() as tape:
        loss = loss_of()
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[first])
    got = tape.gradient(loss, model.trainable_variables)
    n_first = len(first.trainable_weights)
    for i, g in enumerate(got):
        if i < n_first:
            want = mine[i] / N
        else:
            want = np.mean([e[i] for e in everyone], axis=0)
        expect_close(g, want, f"PartialDistributedGradientTape gradient {i}", rtol=1e-5)
    try:
        hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[shared])
        FAILURES.append("PartialDistributedGradientTape accepted a non-layer in local_layers")
    except ValueError:
        pass
