"""Rank 1 kills itself in the middle of a job; the others must not hang."""
import os
import signal
import time

import numpy as np

import hvdlite as hvd

hvd.init()
r = hvd.rank()
for step in range(1000000):
    if r == 1 and step == 20:
        print(f"KILLING at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    # every other call is large enough for the ring allreduce (point-to-point steps)
    big = step % 2 == 0
    hvd.allreduce(np.ones(1 << 17 if big else 1000), name=f"step.{step % 7}.{int(big)}")
