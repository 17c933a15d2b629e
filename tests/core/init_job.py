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


def expect_value_error(arg, needle: str) -> None:
    try:
        hvd.init(arg)
    except ValueError as exc:
        assert needle in str(exc), str(exc)
    else:
        raise AssertionError(f"init({arg!r}) did not raise")
    assert not hvd.is_initialized()


# Bad arguments raise on every rank, before MPI sees them, and hvdlite still starts.
expect_value_error([0, wn], f"rank {wn} is outside MPI_COMM_WORLD")
expect_value_error([0, 0], "rank 0 is listed twice")
expect_value_error(MPI.COMM_NULL, "MPI.COMM_NULL")
hvd.init()
assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="after.bad.init")[0] == wn
hvd.shutdown()
try:
    hvd.allreduce(np.ones(2))
except hvd.NotInitializedError as exc:
    assert "shut down by this process" in str(exc), str(exc)
else:
    raise AssertionError("allreduce after shutdown() did not raise")
print(f"ALL CHECKS PASSED rank {wr}", flush=True)
