"""TensorFlow's error classes for hvdlite's failures, with the codes Horovod's TensorFlow
ops report.

A failed collective raises ``tf.errors.FailedPreconditionError`` (ranks disagreed, or
another rank refused its input), ``InvalidArgumentError`` or ``UnimplementedError`` on
the rank that refused its own input as a bad value or as something hvdlite lacks, and
``UnknownError`` once the engine has stopped. Eagerly these are also
:class:`~hvdlite.common.exceptions.HvdliteError` (and the TypeError, ValueError or
NotImplementedError Horovod raises for such input); inside graphs they are TensorFlow's
own classes. The message names the tensor and the ranks.
"""
from __future__ import annotations

import threading

import tensorflow as tf

from hvdlite.common import basics as _basics
from hvdlite.common.exceptions import HvdliteError

class _TFError:
    """An :class:`HvdliteError` that is also a ``tf.errors.OpError``.

    Horovod's TensorFlow ops fail with TensorFlow's errors: a collective whose ranks
    disagree with ``FailedPreconditionError``, one that meets a stopped engine with
    ``UnknownError``, input its own checks refuse (alltoall splits that do not fit) with
    ``InvalidArgumentError``. hvdlite's TF front end raises the same codes (see
    :func:`_tf_code`), so scripts written for Horovod catch what they expect, and
    ``except hvd.HvdliteError`` still works eagerly. Inside a graph hvdlite's ops (see
    :mod:`hvdlite.tensorflow._kernels`) fail with the same codes, but as TensorFlow's
    own error classes, which are not HvdliteErrors. Only the ``py_function`` fallback
    cannot choose the code: TensorFlow turns its Python exceptions into
    ``UnknownError`` (``InvalidArgumentError`` for a TypeError or ValueError,
    ``UnimplementedError`` for a NotImplementedError)."""

    _code: int  # TensorFlow's error code
    # Raised while AutoGraph traces a function (an op refused when the graph is built),
    # the error would be rebuilt by AutoGraph, which cannot rebuild this class and makes
    # it a StagingError: this attribute tells AutoGraph to let it through unchanged.
    ag_pass_through = True

    def __init__(self, message: str) -> None:
        tf.errors.OpError.__init__(self, None, None, message, self._code)
        self.args = (message,)

    def __reduce__(self):
        return type(self), (self.message,)


class HvdliteFailedPreconditionError(_TFError, HvdliteError, tf.errors.FailedPreconditionError):
    """A collective failed and hvdlite stays usable (ranks disagreed, input refused)."""
    _code = tf.errors.FAILED_PRECONDITION


class HvdliteUnknownError(_TFError, HvdliteError, tf.errors.UnknownError):
    """A collective failed because the engine stopped (shut down, a peer failed)."""
    _code = tf.errors.UNKNOWN


class HvdliteInvalidArgumentError(_TFError, HvdliteError, tf.errors.InvalidArgumentError):
    """This rank refused its own input as a bad value or type (alltoall splits that do
    not fit, splits that are not integers, ...); the other ranks' collective failed
    with :class:`HvdliteFailedPreconditionError`."""
    _code = tf.errors.INVALID_ARGUMENT


class HvdliteUnimplementedError(_TFError, HvdliteError, tf.errors.UnimplementedError):
    """This rank asked for something hvdlite does not implement (Adasum, a reducescatter
    with Max, ...); the other ranks' collective failed with
    :class:`HvdliteFailedPreconditionError`."""
    _code = tf.errors.UNIMPLEMENTED


_PYTHON_TYPES = (NotImplementedError, TypeError, ValueError)
_tf_error_classes: dict[tuple[type, type], type] = {}
_tf_error_classes_lock = threading.Lock()


def _tf_error_class(code_class: type, python_type: type | None) -> type:
    """`code_class` (one of the two above), also a subclass of `python_type`: a
    collective refused because of input Horovod answers with a TypeError, ValueError or
    NotImplementedError stays catchable as that type. Each class is made once, and
    kept in this module under its name so that its errors can be pickled."""
    if python_type is None:
        return code_class
    with _tf_error_classes_lock:
        cls = _tf_error_classes.get((code_class, python_type))
        if cls is None:
            name = f"{code_class.__name__}_{python_type.__name__}"
            cls = type(name, (code_class, python_type), {
                "__module__": __name__,
                "__doc__": f"A {code_class.__name__} that is also a {python_type.__name__}."})
            globals()[name] = cls
            _tf_error_classes[(code_class, python_type)] = cls
    return cls


def _tf_code(error: type[BaseException] | None) -> int:
    """TensorFlow's error code for a collective this rank refused with `error` (an
    :class:`HvdliteError` class) while the engine runs: ``INVALID_ARGUMENT`` for a
    ValueError or TypeError (a bad value, as Horovod's checks of alltoall's splits
    report), ``UNIMPLEMENTED`` for a NotImplementedError, else ``FAILED_PRECONDITION``,
    the code of every collective whose ranks disagreed. The same rule serves eagerly
    (:func:`_as_tf_error`) and in graphs (the codes handed to hvdlite's ops)."""
    if error is not None and issubclass(error, (ValueError, TypeError)):
        return tf.errors.INVALID_ARGUMENT
    if error is not None and issubclass(error, NotImplementedError):
        return tf.errors.UNIMPLEMENTED
    return tf.errors.FAILED_PRECONDITION


_CLASS_OF_CODE = {tf.errors.INVALID_ARGUMENT: HvdliteInvalidArgumentError,
                  tf.errors.UNIMPLEMENTED: HvdliteUnimplementedError,
                  tf.errors.FAILED_PRECONDITION: HvdliteFailedPreconditionError}


def _as_tf_error(exc: BaseException) -> BaseException:
    """`exc` with TensorFlow's error code when it is a failed collective. The engine
    marks itself stopped before it fails what it still holds, so a stopped engine
    means the failure was the stop."""
    if not isinstance(exc, HvdliteError) or isinstance(exc, tf.errors.OpError):
        return exc
    python_type = next((t for t in _PYTHON_TYPES if isinstance(exc, t)), None)
    if _basics.is_initialized():
        cls = _CLASS_OF_CODE[_tf_code(python_type)]
    else:
        cls = HvdliteUnknownError
    cls = _tf_error_class(cls, python_type)
    converted = cls(str(exc))
    converted.__cause__ = exc.__cause__
    converted.__traceback__ = exc.__traceback__
    return converted
