"""A blocked collective can be interrupted by a Python signal handler, and the library
goes on afterwards. Rank 0 waits on collectives that rank 1 submits only later; a
SIGALRM handler raises out of each wait (as Ctrl-C's KeyboardInterrupt would):

* an async allreduce's ``synchronize``: the handle stays pending, and once rank 1 has
  submitted, a second ``synchronize`` returns the result;
* a blocking ``allreduce`` (the NumPy front end's direct path): the arrays stay held
  until the engine is done with them, the request completes when rank 1 submits.

Then the next collective works. Prints ``ALL CHECKS PASSED rank <r>``."""
import signal
import time

import numpy as np

import hvdlite as hvd


class Alarm(Exception):
    pass


def on_alarm(signum, frame):
    raise Alarm()


def interrupted(call) -> float:
    """Seconds until the alarm, 1 s after the start, ended `call`."""
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    start = time.monotonic()
    try:
        call()
    except Alarm:
        return time.monotonic() - start
    raise AssertionError("the collective completed without rank 1")


hvd.init()
r, n = hvd.rank(), hvd.size()
if r == 0:
    signal.signal(signal.SIGALRM, on_alarm)
    handle = hvd.allreduce_async(np.ones(4), op=hvd.Sum, name="late")
    waited = interrupted(lambda: hvd.synchronize(handle))
    assert 0.9 < waited < 3.0, f"the handler ran after {waited:.2f} s"
    out = np.zeros(1000)
    waited = interrupted(lambda: hvd.allreduce_(out, op=hvd.Sum, name="late.blocking"))
    assert 0.9 < waited < 3.0, f"the handler ran after {waited:.2f} s"
    hvd.broadcast_object("interrupted", root_rank=0, name="go")
    np.testing.assert_allclose(hvd.synchronize(handle), np.full(4, float(n)))
    hvd.barrier()  # rank 1's blocking allreduce is done: so is the one interrupted here
    np.testing.assert_allclose(out, np.full(1000, float(n - 1)))  # rank 0 added its zeros
else:
    assert hvd.broadcast_object(None, root_rank=0, name="go") == "interrupted"
    np.testing.assert_allclose(hvd.allreduce(np.ones(4), op=hvd.Sum, name="late"), np.full(4, float(n)))
    np.testing.assert_allclose(hvd.allreduce(np.ones(1000), op=hvd.Sum, name="late.blocking"),
                               np.full(1000, float(n - 1)))
    hvd.barrier()
np.testing.assert_allclose(hvd.allreduce(np.full(3, float(r)), op=hvd.Sum, name="after"),
                           np.full(3, float(sum(range(n)))))
hvd.shutdown()
print(f"ALL CHECKS PASSED rank {r}", flush=True)
