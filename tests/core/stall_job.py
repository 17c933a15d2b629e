"""The last rank never submits 'stalled.tensor'; the stall inspector must name it and
the missing rank, then shut the job down with an error on every rank. With the
argument "cached" every rank runs the tensor once first, so that the stalled requests
reach the coordinator as response-cache hits."""
import sys
import time

import numpy as np

import hvdlite as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
hvd.allreduce(np.ones(2), name="warmup")
if sys.argv[1:] == ["cached"]:
    hvd.allreduce(np.ones(2), name="stalled.tensor")
if r != n - 1:
    try:
        hvd.allreduce(np.ones(2), name="stalled.tensor")
    except hvd.HvdliteError as exc:
        print(f"rank {r} GOT ERROR: {exc}", flush=True)
else:
    time.sleep(8)  # well past the shutdown limit
    try:
        hvd.allreduce(np.ones(2), name="other.tensor")
    except (hvd.HvdliteError, hvd.NotInitializedError) as exc:
        print(f"rank {r} GOT ERROR: {exc}", flush=True)
print(f"rank {r} exiting", flush=True)
