"""Exception types shared by every hvdlite front end."""


class HvdliteError(RuntimeError):
    """A collective failed: ranks disagreed, input was invalid, a peer died, or the
    engine was shut down. The message names the tensor and the ranks involved.

    After an error caused by bad input the library stays usable: the next collective
    works as usual.
    """


# Horovod's name for the same thing, so ``except hvd.HorovodInternalError`` keeps working.
HorovodInternalError = HvdliteError


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's signal, in elastic training, that hosts were added or removed. hvdlite's
    world is fixed, so hvdlite never raises it; the name exists for scripts that catch it."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the hosts of the job changed")
        self.skip_sync = skip_sync


class NotInitializedError(ValueError):
    """Raised when an hvdlite call needs ``hvd.init()`` first (or ran after ``shutdown()``)."""
