"""The last rank never submits 'stalled.tensor'; the stall inspector must name it and
the missing rank, then shut the job down with an error on every rank. With the
argument "cached" every rank runs the tensor once first, so that the stalled requests
reach the coordinator as response-cache hits. With "group" every rank submits two
members of a grouped allreduce that says it has three: rank 0 holds the two, complete
on every rank, for a member no rank sends; that must be named too."""
import sys
import time

import numpy as np

import hvdlite as hvd
from hvdlite.common import ops as _ops
from hvdlite.common.handles import Handle
from hvdlite.mpi_ops import _output_like, _raw

hvd.init()
r, n = hvd.rank(), hvd.size()
hvd.allreduce(np.ones(2), name="warmup")
if sys.argv[1:] == ["group"]:
    gid = _ops.new_group_id()
    keep, requests = [], []
    for i in range(2):
        arr = np.ones(2)
        out, out_raw = _output_like(arr)
        keep.append((arr, out))
        requests.append(_ops.submit(_ops.ALLREDUCE, _raw(arr), out_raw, name=f"short.group.{i}", op=hvd.Sum,
                                    group_id=gid, group_size=3, keepalive=(arr, out)))
    try:
        hvd.synchronize(Handle(requests, lambda done: None, "short.group"))
    except hvd.HvdliteError as exc:
        print(f"rank {r} GOT ERROR: {exc}", flush=True)
    print(f"rank {r} exiting", flush=True)
    sys.exit(0)
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
