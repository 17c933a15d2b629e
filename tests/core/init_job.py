"""hvd.init() on an mpi4py sub-communicator and on a list of ranks."""
import numpy as np
from mpi4py import MPI

import hvdlite as hvd

world = MPI.COMM_WORLD
wr, wn = world.Get_rank(), world.Get_size()
# Even and odd world ranks form two separate hvdlite worlds.
sub = world.Split(color=wr % 2, key=wr)
hvd.init(sub)
assert hvd.size() == sub.Get_size() and hvd.rank() == sub.Get_rank()
got = hvd.allreduce(np.array([wr], np.float64), op=hvd.Sum, name="sub")
assert got[0] == sum(q for q in range(wn) if q % 2 == wr % 2), got
# The user's own MPI traffic on the same communicator does not cross hvdlite's.
token = sub.allreduce(1)
assert token == sub.Get_size()
hvd.shutdown()
# Only world ranks 0 and 1 join this one.
hvd.init([0, 1])
if wr < 2:
    assert hvd.is_initialized() and hvd.size() == min(2, wn)
    got = hvd.allreduce(np.array([wr + 1.0]), op=hvd.Sum, name="pair")
    assert got[0] == (3.0 if wn > 1 else 1.0), got
    hvd.shutdown()
else:
    assert not hvd.is_initialized()
world.Barrier()
print(f"ALL CHECKS PASSED rank {wr}", flush=True)
