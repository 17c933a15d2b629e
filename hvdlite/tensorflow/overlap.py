"""Make TensorFlow submit gradient buckets while the backward pass is still running.

Inside a ``tf.function`` the gradients are submitted by one small op per bucket (see
``graph._run_buckets``), and one op at the end waits for all of them. Nothing needs a
submit op before that wait, so TensorFlow's executor may run it late, and with one
inter-op thread it does: the thread follows the chain of the backward pass and leaves
the ops that are off that chain (a layer's ``BiasAddGrad``, hence the submit that needs
it) in its work queue, which it serves last in, first out, once the chain ends. Every
submit then runs after the last gradient exists. Something else holds a submit back
too: TensorFlow's automatic control dependencies, added when tracing ends, chain every
stateful op without a resource input in program order, so each submit would also wait
for every such op made before it (the op of a collective, or the ``py_function`` of any
Python code in a layer's gradient, which the backward pass may reach last).

:func:`submit_during_backward` orders the graph instead:

* The submit ops leave that chain of stateful ops: they are ordered among themselves
  (through a token that automatic control dependencies treat as a resource they all
  write), and otherwise only by their inputs. They never wait, so the collectives that
  do, the final wait among them, keep one order on every rank, and so does the
  sequence of submits.
* With a single inter-op thread it also ranks every op that the gradients need by the
  first bucket that needs it, and makes the ops that start the work of bucket ``k``
  (those whose inputs all belong to earlier buckets) wait, through a control edge, for
  the submit op of bucket ``k - 1``. When bucket ``k - 1``'s gradients exist, its submit
  op is then the only way forward. With more threads an idle one runs a ready submit by
  itself, and such edges would only cost: on a GPU the executor would wait for each
  bucket's copy to host memory before it queued the next layer's kernels.

Values are unchanged; only the order of ops is. The ranking follows every edge the
graph has or will get from automatic control dependencies (the chain of stateful ops,
program order on each resource), so an op only ever waits for the submit of a bucket
that does not need it, and no cycle can form.

Whether that pays depends on the machine: an allreduce during the backward pass needs a
core that the backward pass does not use (see :func:`enabled`).
"""
from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import Any, Sequence

import tensorflow as tf

_lock = threading.Lock()
# graph -> {name of a submit op: the token its bucket set writes}
_submit_tokens: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()
_resolver_registered = False
_auto: bool | None = None
_warned = False


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _cores_per_local_rank() -> float:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    from hvdlite.common import basics
    try:
        local = basics.local_size()
    except Exception:  # not initialized: decided again at the next trace
        return float(cores)
    return cores / max(1, local)


def enabled() -> bool:
    """Whether gradient buckets are submitted during the backward pass inside graphs
    (``HVDLITE_TF_OVERLAP``: ``1`` on, ``0`` off, ``auto`` or unset: on when this rank
    has a core for communication that TensorFlow's computation does not keep busy --
    TensorFlow sees a GPU or there are at least two cores per rank on this host -- and
    TensorFlow runs more than one inter-op thread, so that an idle one runs a ready
    submit and no control edges are needed). With one inter-op thread, ``auto`` leaves
    it off: the control edges that make that thread submit early were measured to gain
    at most 1.5 % even with the CPU idle for a third of the backward pass, and with one
    core per rank (two ranks on a 2-core machine) the allreduce's copies and sums run on
    the core the backward pass uses and slow the step down (``docs/architecture.md``,
    "TensorFlow: when the gradients are submitted"; ``benchmarks/bench_tf_training.py``
    with ``--modes hvdlite,hvdlite_overlap`` measures both). There the gradients go out
    in one batch after the backward pass; ``1`` turns the edges on. hvdlite addition."""
    value = os.environ.get("HVDLITE_TF_OVERLAP", "auto").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    global _auto
    if _auto is None:
        decided = (tf.config.threading.get_inter_op_parallelism_threads() != 1
                   and (bool(tf.config.list_logical_devices("GPU")) or _cores_per_local_rank() >= 2))
        try:
            from hvdlite.common import basics
            if basics.is_initialized():
                _auto = decided  # stable once the world is known
        except Exception:  # pragma: no cover
            pass
        return decided
    return _auto


def _acd():
    """TensorFlow's automatic-control-dependencies module, or None if it moved."""
    try:
        from tensorflow.python.framework import auto_control_deps
    except ImportError:  # pragma: no cover - another TensorFlow layout
        return None
    needed = ("_get_resource_inputs", "op_is_stateful", "register_acd_resource_resolver")
    return auto_control_deps if all(hasattr(auto_control_deps, n) for n in needed) else None


def _resolve_submit_token(op: Any, reads: Any, writes: Any) -> bool:
    """Automatic control dependencies: a registered submit op writes its token."""
    token = _submit_tokens.get(op.graph, {}).get(op.name)
    if token is None or token in writes:
        return False
    writes.add(token)
    return True


def _register_resolver(acd: Any) -> None:
    global _resolver_registered
    with _lock:
        if not _resolver_registered:
            acd.register_acd_resource_resolver(_resolve_submit_token)
            _resolver_registered = True


def _release_from_stateful_chain(acd: Any, graph: Any, submits: Sequence[Any]) -> None:
    """Make automatic control dependencies order ``submits`` among themselves only."""
    _register_resolver(acd)
    token = tf.constant(0, name="hvdlite_submit_order")  # the resource the submits write
    with _lock:
        names = _submit_tokens.setdefault(graph, {})
        for op in submits:
            names[op.name] = token


def _plan_gates(acd: Any, graph: Any, bucket_inputs: Sequence[Sequence[tf.Tensor]],
                submits: Sequence[Any]) -> list[tuple[Any, int]] | None:
    """The ops that start each bucket's work, with the bucket (see
    :func:`submit_during_backward`); None where the graph is to be left alone."""
    first_submit = min(op._id for op in submits)  # pylint: disable=protected-access
    earlier = [op for op in graph.get_operations() if op._id < first_submit]  # pylint: disable=protected-access

    # The edges automatic control dependencies will add, as one predecessor per op: the
    # previous op in the chain of stateful ops without resource inputs, and the previous
    # op that uses the same resource (conservatively, reads and writes alike).
    extra: dict[Any, list[Any]] = {}
    last_in_chain = None
    last_on_resource: dict[tuple[str, int], Any] = {}
    for op in earlier:
        if op._control_flow_context is not None:  # pylint: disable=protected-access
            return None  # TensorFlow 1 control flow: leave the graph alone
        resources = [t for t, _ in acd._get_resource_inputs(op)]  # pylint: disable=protected-access
        before = []
        for t in resources:
            key = (t.op.name, t.value_index)
            if key in last_on_resource:
                before.append(last_on_resource[key])
            last_on_resource[key] = op
        if not resources and op._is_stateful and acd.op_is_stateful(op):  # pylint: disable=protected-access
            if last_in_chain is not None:
                before.append(last_in_chain)
            last_in_chain = op
        if before:
            extra[op] = before

    def parents(op: Any) -> list[Any]:
        return [t.op for t in op.inputs] + list(op.control_inputs) + extra.get(op, [])

    level: dict[Any, int] = {}  # op -> the first bucket whose gradients need it

    def mark(roots: Sequence[Any], k: int) -> None:
        stack = []
        for op in roots:
            if op not in level:
                level[op] = k
                stack.append(op)
        while stack:
            for parent in parents(stack.pop()):
                if parent not in level:
                    level[parent] = k
                    stack.append(parent)

    for k, tensors in enumerate(bucket_inputs):
        mark([t.op for t in tensors], k)

    gated: list[tuple[Any, int]] = []
    for op, k in level.items():
        if k == 0:
            continue
        ins = parents(op)
        if not ins:
            continue  # a source (a constant): the ops that read it wait instead
        if all(level[p] < k or not parents(p) for p in ins):
            gated.append((op, k))
    return gated


def submit_during_backward(bucket_inputs: Sequence[Sequence[tf.Tensor]],
                           submits: Sequence[Any], gate: bool = True) -> int:
    """Let each of ``submits`` (ops whose inputs are ``bucket_inputs[k]``) run as soon as
    its bucket exists: take them off TensorFlow's chain of stateful ops and, with
    ``gate``, order the graph so that ``submits[k]`` runs before any work that only later
    buckets need. ``gate`` is for a single inter-op thread, whose executor would
    otherwise run the submits last; with more threads an idle one runs a ready submit
    anyway, and edges would only cost (on a GPU, the executor would wait for each
    bucket's copy to host memory before it queued the next layer's kernels). Returns the
    number of control edges added. Leaves the graph alone (returns 0) outside a
    ``tf.function``, when the gradients were made in another graph (captured by a
    ``tf.cond`` branch, as under Keras's ``LossScaleOptimizer``), with TensorFlow 1
    control flow, or when TensorFlow's internals this relies on are missing."""
    if not submits or len(submits) != len(bucket_inputs):
        return 0
    graph = submits[0].graph
    if not getattr(graph, "building_function", False):
        return 0
    for tensors in bucket_inputs:
        for t in tensors:
            if t.graph is not graph:
                return 0
    acd = _acd()
    if acd is None:
        return 0
    if not gate or len(submits) < 2:
        if any(getattr(op, "_control_flow_context", None) is not None for op in submits):
            return 0
        _release_from_stateful_chain(acd, graph, submits)
        return 0
    try:
        gated = _plan_gates(acd, graph, bucket_inputs, submits)
    except (AttributeError, TypeError) as e:  # TensorFlow's graph internals changed
        _warn_once("hvdlite: gradients are submitted after the backward pass: this "
                   "TensorFlow's graph internals are not the ones hvdlite.tensorflow.overlap "
                   f"expects ({e!r})")
        return 0
    if gated is None:
        return 0
    _release_from_stateful_chain(acd, graph, submits)
    for op, k in gated:
        op._add_control_input(submits[k - 1])  # pylint: disable=protected-access
    return len(gated)
