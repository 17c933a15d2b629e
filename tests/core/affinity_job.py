"""HOROVOD_THREAD_AFFINITY=<core per local rank>: this rank's background thread runs
on its core only, and the main thread stays where it was."""
import os
from pathlib import Path

import numpy as np

import hvdlite as hvd

hvd.init()
hvd.allreduce(np.ones(4), name="warm")  # the background thread is running by now
cores = [int(c) for c in os.environ["HOROVOD_THREAD_AFFINITY"].split(",")]
want = cores[hvd.local_rank()]
allowed = {}
for task in Path("/proc/self/task").iterdir():
    for line in (task / "status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            allowed[int(task.name)] = line.split(":", 1)[1].strip()
pinned = [tid for tid, cpus in allowed.items() if cpus == str(want)]
assert len(pinned) == 1, (want, allowed)
assert allowed[os.getpid()] != str(want) or os.cpu_count() == 1, allowed  # the main thread is not pinned
me = hvd.rank()
hvd.shutdown()
print(f"ALL CHECKS PASSED rank {me}", flush=True)
