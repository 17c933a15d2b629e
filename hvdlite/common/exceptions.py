"""Exception types shared by every hvdlite front end."""


class HvdliteError(RuntimeError):
    """A collective failed: ranks disagreed, input was invalid, a peer died, or the
    engine was shut down. The message names the tensor and the ranks involved.

    After an error caused by bad input the library stays usable: the next collective
    works as usual.
    """


# Horovod's name for the same thing, so ``except hvd.HorovodInternalError`` keeps working.
HorovodInternalError = HvdliteError


class NotInitializedError(ValueError):
    """Raised when an hvdlite call needs ``hvd.init()`` first (or ran after ``shutdown()``)."""
