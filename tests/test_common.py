"""Single-process checks of the neutral layer every front end uses (hvdlite/common):
Horovod's rules for ``op``/``average``, the error types of refused input, the element
type tables, and handles. The multi-rank behaviour is checked by each front end's jobs
(tests/core, tests/torch, tests/tensorflow)."""
from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

import hvdlite as hvd
from hvdlite.common import codes, ops
from hvdlite.common.exceptions import (HvdliteError, HvdliteNotImplementedError, HvdliteTypeError,
                                       HvdliteValueError, NotInitializedError, refusal_error_for)
from hvdlite.common.handles import Handle


def test_resolve_op_follows_horovod() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning without `average`
        assert ops.resolve_op(None, None) == ops.Average
        assert ops.resolve_op(ops.Max, None) == ops.Max
        assert ops.resolve_op(17, None) == 17  # checked when submitted, on every rank
    for average, op in ((True, ops.Average), (False, ops.Sum), (1, ops.Average), (0, ops.Sum)):
        with pytest.warns(DeprecationWarning, match="average"):
            assert ops.resolve_op(None, average) == op
    with pytest.raises(ValueError, match="supersedes"):
        ops.resolve_op(ops.Sum, False)


def test_op_problem_names_adasum_and_unknown_ops() -> None:
    for op in (ops.Average, ops.Sum, ops.Adasum, ops.Min, ops.Max, ops.Product):
        assert ops.op_problem(op) is None
    for op in (17, "Sum", [1]):
        problem, error = ops.op_problem(op)
        assert "unknown reduce op" in problem and error is HvdliteValueError


@pytest.mark.parametrize("front_end", ["hvdlite", "hvdlite.torch"])
def test_front_ends_share_the_op_rules_before_init(front_end: str) -> None:
    """Both op and average: a ValueError at once (every rank sees it, nothing is sent);
    average alone warns, then the call needs init()."""
    if front_end == "hvdlite.torch" and importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    mod = importlib.import_module(front_end)
    x = np.ones(2, np.float32)
    if front_end == "hvdlite.torch":
        import torch
        x = torch.ones(2)
    with pytest.raises(ValueError, match="supersedes"):
        mod.allreduce(x, average=True, op=mod.Sum)
    with pytest.warns(DeprecationWarning, match="average"), pytest.raises(NotInitializedError):
        mod.allreduce(x, average=False)


def test_refused_input_errors_are_also_the_type_horovod_raises() -> None:
    for builtin, cls in ((TypeError, HvdliteTypeError), (ValueError, HvdliteValueError),
                         (NotImplementedError, HvdliteNotImplementedError)):
        assert refusal_error_for(builtin("x")) is cls
        assert issubclass(cls, builtin) and issubclass(cls, HvdliteError)
    assert refusal_error_for(RuntimeError("x")) is HvdliteError
    assert refusal_error_for(HvdliteValueError("x")) is HvdliteValueError


def test_element_type_tables_agree_with_the_core() -> None:
    core = hvd.common.basics._load_core()
    assert codes.DTYPES == core.DATA_TYPES
    assert {codes.KIND_NAMES[c]: c for c in codes.KIND_NAMES} == core.REQUEST_TYPES
    assert codes.REDUCE_OPS == core.REDUCE_OPS and codes.CPU_DEVICE == core.CPU_DEVICE
    for name, dt in codes.NP_DTYPE_OF_NAME.items():
        assert codes.NAME_OF_NP_DTYPE[dt] == name and dt.itemsize == codes.ITEMSIZE[name]
    assert set(codes.NP_DTYPE_OF_NAME) == set(codes.DTYPES)  # ml_dtypes gives bfloat16
    if importlib.util.find_spec("torch") is not None:
        import torch
        table = codes.framework_dtypes(torch)
        assert table[torch.float32] == "float32" and table[torch.bfloat16] == "bfloat16"
        assert sorted(table.values()) == sorted(codes.DTYPES)


class _Part:
    """A stand-in for an engine request."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error, self.waited = error, 0

    def poll(self) -> bool:
        return self.waited > 0

    def wait(self) -> None:
        self.waited += 1
        if self.error is not None:
            raise self.error


def test_handle_waits_for_every_part_and_finishes_once() -> None:
    parts = [_Part(), _Part()]
    calls = []
    h = Handle(parts, lambda ps: calls.append(ps) or "result", "h")
    assert not h.poll()
    assert h.wait() == "result" and h.wait() == "result" and h.poll()
    assert len(calls) == 1 and [p.waited for p in parts] == [1, 1]


def test_handle_raises_the_first_failure_after_waiting_for_the_rest() -> None:
    first, second = HvdliteTypeError("rank 1: refused"), HvdliteError("another")
    parts = [_Part(), _Part(first), _Part(second), _Part()]
    h = Handle(parts, lambda ps: pytest.fail("finish must not run"), "h")
    for _ in range(2):
        with pytest.raises(HvdliteTypeError, match="rank 1: refused"):
            h.wait()
    assert [p.waited for p in parts] == [1, 1, 1, 1]
    # A failure while submitting comes first, still after the parts submitted finished.
    part = _Part(HvdliteError("later"))
    h = Handle([part], lambda ps: None, "h", error=KeyError("while submitting"))
    assert isinstance(h.submit_error, KeyError)
    with pytest.raises(KeyError):
        h.wait()
    assert part.waited == 1 and h.submit_error is None


def test_a_request_dropped_while_dropped_requests_are_reaped_does_not_deadlock() -> None:
    """The cyclic garbage collector runs finalizers at any allocation, also while
    dropped requests are being reaped before a submission (after a failed step, whose
    requests nothing waited for, sit in reference cycles): a request finalized there
    waits for the next reap, where it used to wait for ever on a lock its own thread
    held, and that worker stopped submitting."""
    import threading

    from hvdlite.common import handles

    released: list[int] = []

    class Core:
        def poll(self, hid: int) -> bool:
            if hid == 1:
                late = handles.Request(2, 0, "late", keepalive=b"x")
                del late  # finalized here, as by the garbage collector
            return True

        def release(self, hid: int) -> None:
            released.append(hid)

    saved = list(handles._orphans)
    handles._orphans[:] = [(1, b"y")]
    try:
        reaper = threading.Thread(target=handles._reap_orphans, args=(Core(),), daemon=True)
        reaper.start()
        reaper.join(10)
        assert not reaper.is_alive(), "the reap deadlocked"
        assert released == [1]
        assert handles._orphans == [(2, b"x")]
        handles._reap_orphans(Core())
        assert released == [1, 2] and handles._orphans == []
    finally:
        handles._orphans[:] = saved
