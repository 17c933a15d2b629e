"""A few training-like steps with the timeline on (path from HVDLITE_TIMELINE), then a
second trace started and stopped at run time (path in argv[1])."""
import sys

import numpy as np

import hvdlite as hvd

hvd.init()
r = hvd.rank()
for step in range(3):
    hs = [hvd.allreduce_async(np.full(1000 * (i + 1), r, np.float32), op=hvd.Sum, name=f"grad.{i}")
          for i in range(6)]
    hs.append(hvd.allreduce_async(np.ones(3_000_000, np.float32), name="grad.big"))
    for h in hs:
        hvd.synchronize(h)
hvd.allgather(np.ones((r + 1, 2)), name="gathered")
for step in range(3):  # small allgathers in flight together are fused
    hs = [hvd.allgather_async(np.full((r + i, 3), r, np.float32), name=f"gathered.{i}") for i in range(6)]
    for h in hs:
        hvd.synchronize(h)
hvd.broadcast(np.ones(4), 0, name="bcast")
hvd.start_timeline(sys.argv[1], mark_cycles=True)
hvd.allreduce(np.ones(10), name="runtime.tensor")
hvd.stop_timeline()
hvd.shutdown()
print(f"ALL CHECKS PASSED rank {r}", flush=True)
