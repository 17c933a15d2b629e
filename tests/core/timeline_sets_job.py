"""The timeline with process sets, on 3 ranks: rank 0's trace holds the collectives of
every set (named "NAME (process set ID)"), beside the global set's: those rank 0 is in,
and those of a set without rank 0, which that set's rank 0 sends it, the last just
before the trace stops. A set added at run time and removed again leaves the trace
writing; the global set's stop_timeline ends it (path in argv[1])."""
import sys

import numpy as np

import hvdlite as hvd

with_zero, without_zero = hvd.ProcessSet([0, 1]), hvd.ProcessSet([1, 2])
hvd.init(process_sets=[with_zero, without_zero])
r, n = hvd.rank(), hvd.size()
assert n == 3, n
hvd.start_timeline(sys.argv[1])
for step in range(3):
    # The same name on the global set and on a set: two tensors in the trace.
    got = hvd.allreduce(np.full(100, float(r)), op=hvd.Sum, name="shared.name")
    np.testing.assert_allclose(got, 3.0)
    if with_zero.included():
        got = hvd.allreduce(np.full(100, float(r)), op=hvd.Sum, name="shared.name", process_set=with_zero)
        np.testing.assert_allclose(got, 1.0)
        g = hvd.allgather(np.full((r + 1, 2), r), name="set.gather", process_set=with_zero)
        assert g.shape == (3, 2)
    if without_zero.included():
        got = hvd.allreduce(np.full(10, float(r)), op=hvd.Sum, name="not.on.zero", process_set=without_zero)
        np.testing.assert_allclose(got, 3.0)
dynamic = hvd.add_process_set([0, 2])
if dynamic.included():
    hvd.broadcast(np.ones(4), root_rank=2, name="dynamic.bcast", process_set=dynamic)
hvd.remove_process_set(dynamic)
hvd.allreduce(np.ones(10), name="after.removal")
if without_zero.included():
    hvd.allreduce(np.ones(10), name="late.not.on.zero", process_set=without_zero)
hvd.barrier()
hvd.stop_timeline()
hvd.shutdown()
print(f"ALL CHECKS PASSED rank {r}", flush=True)
