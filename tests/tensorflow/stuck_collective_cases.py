"""Run by test_tf_interrupt.py under pytest on 2 ranks: an eager TensorFlow allreduce
that no other rank ever matches (each rank names its own), so it waits forever unless
something ends the wait. A watchdog thread ends the process with exit status
WATCHDOG_EXIT after WATCHDOG_S whatever happens (the wait leaves the GIL free for it),
so a wait nothing else interrupts costs that long and no more, and says so. Not
collected by the suite itself (the file name does not start with ``test_``)."""
from __future__ import annotations

import os
import threading

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402

WATCHDOG_S = 25
WATCHDOG_EXIT = 97

hvd.init()


def test_unmatched_allreduce_waits() -> None:
    watchdog = threading.Timer(WATCHDOG_S, os._exit, (WATCHDOG_EXIT,))
    watchdog.daemon = True
    watchdog.start()
    print(f"rank {hvd.rank()} waiting", flush=True)
    hvd.allreduce(tf.ones(2), name=f"unmatched.{hvd.rank()}")
