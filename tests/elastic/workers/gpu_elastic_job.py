"""Elastic training on the (fake) GPU path: NCCL communicators after a lost worker.

Run on the fake CUDA runtime and NCCL (tests/fake_cuda) under ``hvdlite-run --min-np``:
each step allreduces a device array (NCCL) and a host array (MPI) inside
``hvd.elastic.run`` over an ``ObjectState``; the process that started as rank
``KILL_RANK`` kills itself at step ``KILL_STEP``. The survivors must go on with new
NCCL communicators of their own world: every later step's sums are checked exactly
against the world size of the moment. Each survivor prints ``GPU ELASTIC OK``.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.fake_cuda import device as fake  # noqa: E402

fake.load(os.environ["FAKE_CUDA_DIR"])

import hvdlite as hvd  # noqa: E402
from hvdlite.common.elastic import ObjectState, run_fn, sync_root  # noqa: E402
from hvdlite.common.objects import broadcast_object  # noqa: E402

STEPS = 40


def main() -> None:
    hvd.init()
    first = hvd.rank()
    kill_rank, kill_step = int(os.environ["KILL_RANK"]), int(os.environ["KILL_STEP"])
    state = ObjectState(bcast_object=lambda obj: broadcast_object(obj, root_rank=sync_root()),
                        get_rank=hvd.rank, step=0, total=0.0)
    sizes = []

    @run_fn
    def train(state):
        while state.step < STEPS:
            if first == kill_rank and state.step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            n, r = hvd.size(), hvd.rank()
            out = hvd.allreduce(fake.FakeDeviceArray.from_numpy(np.full(1024, r + 1, np.float32)),
                                op=hvd.Sum, name="grad.gpu")
            got = fake.cai_to_numpy(out)
            want = n * (n + 1) / 2
            assert np.all(got == want), (got[:4], want, n)
            host = hvd.allreduce(np.full(8, 1.0), op=hvd.Sum, name="grad.host")
            assert np.all(host == n), (host, n)
            state.total += float(want)
            state.step += 1
            sizes.append(n)
            if state.step % 2 == 0:
                state.commit()

    train(state)
    assert sizes[0] == 3 and sizes[-1] == 2, sizes
    print(f"GPU ELASTIC OK first rank {first} rank {hvd.rank()} of {hvd.size()} total {state.total}", flush=True)


if __name__ == "__main__":
    main()
