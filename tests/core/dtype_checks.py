"""Allreduce against NumPy's own arithmetic: every element type x every reduce op x sizes
1, 7, 15, 16, 17, 31, 33, 1000 and 4097, through each of the engine's paths, from the
NumPy, PyTorch or TensorFlow front end, on the global set and on a process set.

Run by tests/core/test_dtypes.py (and tests/hosts/test_hosts.py across emulated hosts)
through hvdlite-run:

    dtype_checks.py --frontend numpy|torch|tensorflow --paths negotiated,carried,fused,set,adasum
                    [--device cuda]   (torch: tensors on the GPU; on a machine lent one)

What the results are compared with:

* Integer inputs are drawn from the type's whole range, so sums and products overflow.
  The reference is NumPy's arithmetic in that type, which wraps around (modulo 2**bits),
  as MPI, NCCL and Horovod define it; it does not depend on the order of the ranks.
  ``Average`` of integers is Horovod's: the wrapped sum times 1/size in double
  precision, truncated toward zero (on one rank, the input itself). ``Min``, ``Max`` and integer results are exact.
* Float inputs are normal values plus, on every rank, 3/4 of the type's largest finite
  value at every fifth element, so that sums and products of two or more ranks overflow
  to infinity there. The reference is the float64 result of NumPy in rank order, rounded
  to the type; where that is infinite the result must be the same infinity. Elsewhere a
  sum may be taken in any order (MPI chooses it), so the tolerance per element is
  ``size * (eps * sum(|x_i|) + tiny)`` (``eps`` and the smallest subnormal ``tiny`` of
  the element type), the bound of any order's rounding; a product's is
  ``size * (eps * |product| + tiny * prod(max(1, |x_i|)))``. ``Average`` is the sum in the
  element type, then scaled by 1/size.
* Adasum (floats; power-of-two sizes) is compared with its pairwise formula applied in
  the binary tree of ranks, in float64, with a relative tolerance of 50 eps.

Paths:

* ``negotiated``: each call under a new name, negotiated through rank 0 and reduced by
  ``MPI_Allreduce`` or hvdlite's ring (``HVDLITE_RING_MIN_SEGMENT_BYTES=1`` puts every
  call of at least one element per rank on the ring).
* ``carried``: the same names three times; with the response cache on, Sum and Average
  of at most 16 KiB are then reduced inside the cycle that agrees on them. The script
  checks that they were (the engine's ``carried`` count).
* ``fused``: the nine sizes of one type and op submitted together, fused into one buffer.
* ``set``: the negotiated path on a process set of every rank but rank 1.
* ``adasum``: ``op=Adasum`` for float16, float32 and float64.

Prints ``PASS <path> rank <r>`` per path and ``ALL CHECKS PASSED rank <r>`` at the end.
"""
from __future__ import annotations

import argparse
import functools
import sys

import numpy as np

SIZES = (1, 7, 15, 16, 17, 31, 33, 1000, 4097)
TYPES = ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")
OPS = ("Sum", "Average", "Min", "Max", "Product")
CARRY_MAX_BYTES = 16 * 1024  # what a cycle carries (CacheCycle::kMaxCarriedBytes)


def np_type(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def inputs(q: int, tname: str, n: int, seed: int, for_adasum: bool = False) -> np.ndarray:
    """Rank q's input: the same on every rank that builds it."""
    rng = np.random.default_rng([seed, q])
    dt = np_type(tname)
    if dt.kind in "ui":
        info = np.iinfo(dt)
        return rng.integers(int(info.min), int(info.max), size=n, endpoint=True, dtype=np.int64 if dt.kind == "i"
                            else np.uint64).astype(dt)
    x = rng.standard_normal(n)
    if not for_adasum:
        x[::5] = float(fmax(tname)) * 0.75
    return x.astype(dt)


def fmax(tname: str) -> float:
    if tname == "bfloat16":
        import ml_dtypes
        return float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    return float(np.finfo(np.dtype(tname)).max)


def feps(tname: str) -> float:
    if tname == "bfloat16":
        return 2.0 ** -7
    return float(np.finfo(np.dtype(tname)).eps)


def tiny(tname: str) -> float:
    """The type's smallest subnormal: the absolute error of a rounding near zero."""
    return {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149, "float64": 5e-324}[tname]


def check(got: np.ndarray, xs: list[np.ndarray], tname: str, op: str, what: str) -> None:
    dt = np_type(tname)
    n = len(xs)
    assert got.dtype == dt and got.shape == xs[0].shape, f"{what}: got {got.dtype}{got.shape}"
    if dt.kind in "ui":
        with np.errstate(over="ignore"):
            if op in ("Sum", "Average"):
                want = functools.reduce(np.add, xs)
                if op == "Average" and n > 1:  # a factor of 1 leaves the sum alone
                    want = np.trunc(want.astype(np.float64) * (1.0 / n)).astype(dt)
            elif op == "Product":
                want = functools.reduce(np.multiply, xs)
            else:
                want = functools.reduce(np.minimum if op == "Min" else np.maximum, xs)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (f"{what}: {bad.size} of {got.size} elements differ, first at {bad[0]}: "
                               f"{got[bad[0]]} != {want[bad[0]]} (inputs {[int(x[bad[0]]) for x in xs]})")
        return
    f64 = [x.astype(np.float64) for x in xs]
    g = got.astype(np.float64)
    eps = feps(tname)
    with np.errstate(over="ignore", invalid="ignore"):
        if op in ("Min", "Max"):
            want = functools.reduce(np.minimum if op == "Min" else np.maximum, f64)
            tol = np.zeros_like(want)
        elif op in ("Sum", "Average"):
            exact = functools.reduce(np.add, f64)
            want = exact.astype(dt).astype(np.float64)  # overflows to inf where the type does
            tol = n * eps * functools.reduce(np.add, [np.abs(x) for x in f64]) + n * tiny(tname)
            if op == "Average":
                want = (want / n).astype(dt).astype(np.float64)
                tol = tol / n + eps * np.abs(want)
        else:
            want = functools.reduce(np.multiply, f64).astype(dt).astype(np.float64)
            # A partial product that rounds near zero loses up to a subnormal's spacing,
            # which the later factors scale.
            spread = functools.reduce(np.multiply, [np.maximum(1.0, np.abs(x)) for x in f64])
            tol = n * eps * np.abs(want) + n * tiny(tname) * spread
    inf = np.isinf(want)
    bad_inf = np.flatnonzero(inf & (g != want))
    assert bad_inf.size == 0, f"{what}: element {bad_inf[0]} is {g[bad_inf[0]]}, expected {want[bad_inf[0]]}"
    fin = ~inf
    err = np.abs(g[fin] - want[fin])
    bad = np.flatnonzero(~(err <= tol[fin]))
    assert bad.size == 0, (f"{what}: {bad.size} elements off, first {g[fin][bad[0]]} != {want[fin][bad[0]]} "
                           f"(tolerance {tol[fin][bad[0]]})")


def adasum_reference(xs: list[np.ndarray]) -> np.ndarray:
    """Adasum over the binary tree of ranks: pairs (0,1), (2,3), ..., then pairs of those."""
    level = [x.astype(np.float64) for x in xs]
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[0::2], level[1::2]):
            dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
            ca = 1.0 - dot / (2 * aa) if aa else 1.0
            cb = 1.0 - dot / (2 * bb) if bb else 1.0
            nxt.append(ca * a + cb * b)
        level = nxt
    return level[0]


class Frontend:
    """The calls a front end makes, on NumPy arrays in and out."""

    def __init__(self, kind: str, set_members: list[int] | None, device: str = "cpu") -> None:
        self.kind, self.device = kind, device
        if kind == "numpy":
            import hvdlite as hvd
            self.hvd = hvd
        elif kind == "torch":
            import torch
            import hvdlite.torch as hvd
            self.torch, self.hvd = torch, hvd
        else:
            import tensorflow as tf
            import hvdlite.tensorflow as hvd
            self.tf, self.hvd = tf, hvd
        self.set = None
        if set_members is None:
            self.hvd.init()
        else:
            self.set = self.hvd.ProcessSet(set_members)
            self.hvd.init(process_sets=[self.set])

    def types(self) -> list[str]:
        if self.kind == "tensorflow":
            # TensorFlow's front end reduces the engine's types (int16 is moved as bytes only).
            return [t for t in TYPES if t != "int16"]
        if self.kind == "numpy":
            return [t for t in TYPES if t != "int16"]
        return list(TYPES)

    def op(self, name: str):
        return getattr(self.hvd, name)

    def to_fe(self, x: np.ndarray):
        if self.kind == "numpy":
            return x
        if self.kind == "torch":
            if x.dtype.name == "bfloat16":
                return self.torch.from_numpy(x.view(np.int16).copy()).view(self.torch.bfloat16).to(self.device)
            return self.torch.from_numpy(x.copy()).to(self.device)
        if x.dtype.name == "bfloat16":
            return self.tf.constant(x.astype(np.float32), dtype=self.tf.bfloat16)
        return self.tf.constant(x)

    def to_np(self, t, tname: str) -> np.ndarray:
        if self.kind == "numpy":
            return np.asarray(t)
        if self.kind == "torch":
            t = t.cpu()
            if tname == "bfloat16":
                return t.view(self.torch.int16).numpy().view(np_type("bfloat16"))
            return t.numpy()
        if tname == "bfloat16":
            return self.tf.cast(t, self.tf.float32).numpy().astype(np_type("bfloat16"))
        return t.numpy()

    def allreduce(self, x: np.ndarray, op: str, name: str, process_set=None) -> np.ndarray:
        kw = {} if process_set is None else {"process_set": process_set}
        out = self.hvd.allreduce(self.to_fe(x), op=self.op(op), name=name, **kw)
        return self.to_np(out, x.dtype.name)

    def allreduce_async(self, x: np.ndarray, op: str, name: str):
        if self.kind == "tensorflow":
            return None  # TensorFlow has no async form; the fused path uses grouped_allreduce
        return self.hvd.allreduce_async(self.to_fe(x), op=self.op(op), name=name)

    def fused(self, xs: list[np.ndarray], op: str, name: str) -> list[np.ndarray]:
        """Several tensors of one type submitted together."""
        tname = xs[0].dtype.name
        if self.kind == "tensorflow":
            outs = self.hvd.grouped_allreduce([self.to_fe(x) for x in xs], op=self.op(op), name=name)
            return [self.to_np(o, tname) for o in outs]
        handles = [self.hvd.allreduce_async(self.to_fe(x), op=self.op(op), name=f"{name}.{i}")
                   for i, x in enumerate(xs)]
        return [self.to_np(self.hvd.synchronize(h), tname) for h in handles]

    def carried_count(self) -> int:
        from hvdlite.common import basics
        return int(basics.core().stats(0)["carried"])


def run_negotiated(fe: Frontend, r: int, n: int, tag: str, process_set=None, members=None) -> None:
    ranks = members if members is not None else list(range(n))
    seed = 10
    for tname in fe.types():
        for op in OPS:
            for size in SIZES:
                seed += 1
                xs = [inputs(q, tname, size, seed) for q in ranks]
                got = fe.allreduce(xs[ranks.index(r)], op, f"{tag}.{tname}.{op}.{size}", process_set)
                check(got, xs, tname, op, f"{tag} {fe.kind} {tname} {op} size {size}")


def run_carried(fe: Frontend, r: int, n: int) -> None:
    before = fe.carried_count()
    small = 0
    for rep in range(3):
        seed = 5000
        for tname in fe.types():
            for op in OPS:
                for size in SIZES:
                    seed += 1
                    xs = [inputs(q, tname, size, seed + 100000 * rep) for q in range(n)]
                    got = fe.allreduce(xs[r], op, f"carry.{tname}.{op}.{size}")
                    check(got, xs, tname, op, f"carried {fe.kind} {tname} {op} size {size} repeat {rep}")
                    if rep and op in ("Sum", "Average") and size * np_type(tname).itemsize <= CARRY_MAX_BYTES:
                        small += 1
    carried = fe.carried_count() - before
    # Repeats of small Sum/Average calls that every rank has ready are carried; a few may
    # go the normal way when ranks offer them at different moments.
    if n > 1:
        assert carried >= small * 3 // 4, f"only {carried} of {small} repeated small allreduces were carried"


def run_fused(fe: Frontend, r: int, n: int) -> None:
    seed = 20000
    for tname in fe.types():
        for op in OPS:
            seed += 1
            xss = [[inputs(q, tname, size, seed * 16 + k) for q in range(n)] for k, size in enumerate(SIZES)]
            outs = fe.fused([xs[r] for xs in xss], op, f"fused.{tname}.{op}")
            for size, xs, got in zip(SIZES, xss, outs):
                check(got, xs, tname, op, f"fused {fe.kind} {tname} {op} size {size}")


def run_adasum(fe: Frontend, r: int, n: int) -> None:
    if n & (n - 1):
        return  # Adasum needs a power-of-two number of ranks
    seed = 30000
    for tname in ("float16", "float32", "float64"):  # Adasum's types, as Horovod's
        for size in SIZES:
            seed += 1
            xs = [inputs(q, tname, size, seed, for_adasum=True) for q in range(n)]
            got = fe.allreduce(xs[r], "Adasum", f"adasum.{tname}.{size}").astype(np.float64)
            want = adasum_reference(xs)
            scale = max(1.0, float(np.max(np.abs(want))))
            tol = 50 * feps(tname) * scale * n
            err = float(np.max(np.abs(got - want)))
            assert err <= tol, f"adasum {fe.kind} {tname} size {size}: max error {err} > {tol}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--frontend", choices=["numpy", "torch", "tensorflow"], default="numpy")
    p.add_argument("--paths", default="negotiated,carried,fused,set,adasum")
    p.add_argument("--device", default="cpu", help="torch only: 'cuda' puts the tensors on the rank's GPU")
    args = p.parse_args()
    paths = args.paths.split(",")
    from mpi4py import MPI
    n = MPI.COMM_WORLD.Get_size()
    members = [q for q in range(n) if q != 1] if n > 2 else [0]
    if n == 1 and "set" in paths:
        paths.remove("set")  # one rank has no set apart from the global one
    if args.device != "cpu":
        import torch
        torch.cuda.set_device(int(__import__("os").environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
                              % torch.cuda.device_count())
    fe = Frontend(args.frontend, members if "set" in paths else None, args.device)
    hvd = fe.hvd
    r = hvd.rank()
    assert hvd.size() == n
    for path in paths:
        if path == "negotiated":
            run_negotiated(fe, r, n, "neg")
        elif path == "carried":
            run_carried(fe, r, n)
        elif path == "fused":
            run_fused(fe, r, n)
        elif path == "set":
            if r in members:
                run_negotiated(fe, r, n, "set", process_set=fe.set, members=members)
        elif path == "adasum":
            run_adasum(fe, r, n)
        else:
            sys.exit(f"unknown path {path}")
        print(f"PASS {path} rank {r}", flush=True)
    hvd.barrier()
    print(f"ALL CHECKS PASSED rank {r}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
