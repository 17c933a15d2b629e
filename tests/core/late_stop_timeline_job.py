"""Rank 0 shuts down right after the last collective; the others reach their closing
stop_timeline() a second later, when rank 0's shutdown has ended their engines too:
it must do nothing (the timeline is closed), while start_timeline still refuses."""
import time

import numpy as np

import hvdlite as hvd

hvd.init()
r = hvd.rank()
hvd.allreduce(np.ones(4), name="last")
if r == 0:
    hvd.shutdown()
else:
    time.sleep(1.0)
    assert not hvd.is_initialized()
    hvd.stop_timeline()
    try:
        hvd.start_timeline("never.json")
    except hvd.NotInitializedError as exc:
        assert "shut down" in str(exc), exc
    else:
        raise AssertionError("start_timeline after shutdown was accepted")
print(f"ALL CHECKS PASSED rank {r}", flush=True)
