"""Exception types shared by every hvdlite front end."""


class HvdliteError(RuntimeError):
    """A collective failed: ranks disagreed, input was invalid, a peer died, or the
    engine was shut down. The message names the tensor and the ranks involved.

    After an error caused by bad input the library stays usable: the next collective
    works as usual.
    """

    # Exception's own constructor (the same behaviour as RuntimeError's): TensorFlow's
    # AutoGraph re-raises an error from a traced function as its own type only when the
    # type is built that way, and would otherwise turn it into a StagingError.
    __init__ = Exception.__init__


# Horovod's name for the same thing, so ``except hvd.HorovodInternalError`` keeps working.
HorovodInternalError = HvdliteError
"""Horovod's name of :class:`HvdliteError`: the same class, so that
``except hvd.HorovodInternalError`` catches hvdlite's failed collectives."""


# Input that one rank could not use is refused on every rank (see
# hvdlite.common.ops.refuse). Where Horovod raises a TypeError, ValueError or
# NotImplementedError for such input, the rank that refused it raises one of these:
# the type a Horovod script catches, and an HvdliteError like the other ranks' failure.

class HvdliteTypeError(HvdliteError, TypeError):
    """A collective was refused on every rank because one rank's input has a type it
    cannot take (a dtype the operation does not support, a sparse tensor, ...)."""


class HvdliteValueError(HvdliteError, ValueError):
    """A collective was refused on every rank because one rank passed a bad value
    (an unknown reduce op, splits that are not integers, ...)."""


class HvdliteNotImplementedError(HvdliteError, NotImplementedError):
    """A collective was refused on every rank because one rank asked for something
    hvdlite does not implement (the Adasum reduction, ...)."""


def refusal_error_for(exc: BaseException) -> type[HvdliteError]:
    """The :class:`HvdliteError` class to raise when input was refused because a local
    check raised `exc`: the one that is also `exc`'s built-in type, so that
    ``except TypeError`` (or ValueError, NotImplementedError) still catches it."""
    if isinstance(exc, HvdliteError):
        return type(exc)
    if isinstance(exc, NotImplementedError):
        return HvdliteNotImplementedError
    if isinstance(exc, TypeError):
        return HvdliteTypeError
    if isinstance(exc, ValueError):
        return HvdliteValueError
    return HvdliteError


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal, in elastic training, that workers are to be added: raised on
    every rank by a state's ``commit()`` (or ``check_host_updates()``) when the host
    discovery script offers new slots, and caught by ``hvd.elastic.run``, which then
    brings the new workers in."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the hosts of the job changed")
        self.skip_sync = skip_sync


class ElasticJobError(HvdliteError):
    """Elastic training cannot go on: fewer workers than ``--min-np`` for longer than
    ``--elastic-timeout``, or ``--reset-limit`` resets reached. Raised on every rank."""


class NotInitializedError(ValueError):
    """Raised when an hvdlite call needs ``hvd.init()`` first (or ran after ``shutdown()``)."""
