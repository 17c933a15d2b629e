"""hvd.init(process_sets="dynamic") in the NumPy front end, with no process-set name
used before init: the module that keeps the sets is loaded on first use, after init,
and must still know that dynamic sets were asked for."""
import sys

import numpy as np

import hvdlite as hvd

# The case under test: nothing has loaded the process-set module yet.
assert "hvdlite.common.process_sets" not in sys.modules, "the job no longer tests a late load"
hvd.init(process_sets="dynamic")
me = hvd.rank()
ps = hvd.add_process_set([0, 1])
if ps.included():
    got = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum, name="dyn", process_set=ps)
    assert got[0] == 3.0, got
hvd.remove_process_set(ps)
got = hvd.allreduce(np.array([1.0]), op=hvd.Sum, name="after")
assert got[0] == hvd.size(), got
hvd.shutdown()
print(f"ALL CHECKS PASSED rank {me}", flush=True)
