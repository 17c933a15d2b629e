"""What GPU failures look like on every rank (fake CUDA and NCCL, tests/fake_cuda).

``python gpu_failure_job.py SCENARIO``; each scenario prints ``SCENARIO OK rank R`` when
this rank saw what it should:

* ``nccl_error``: the fake fails one rank's NCCL call (HVDLITE_FAKE_NCCL_FAIL or
  _ASYNC_FAIL, set by the test). Every rank must get an HvdliteError naming the tensor
  and the failing rank within the test's timeout, and ``init()`` again must give a
  working GPU path.
* ``stalled_peer``: one rank's NCCL call never finishes (HVDLITE_FAKE_NCCL_ASYNC_MODE=
  stall). With HOROVOD_STALL_SHUTDOWN_TIME_SECONDS set, every rank must fail within
  about that time, NCCL aborted, instead of hanging.
* ``missing_nccl`` / ``missing_runtime``: NCCL or the CUDA runtime cannot be loaded. A
  GPU collective fails on every rank with a message that says what was searched; host
  collectives keep working.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fake_cuda import device as fake  # noqa: E402

FAKE_DIR = os.environ["FAKE_CUDA_DIR"]
fake.load(FAKE_DIR)

import hvdlite as hvd  # noqa: E402


def dev(arr: np.ndarray) -> fake.FakeDeviceArray:
    return fake.FakeDeviceArray.from_numpy(arr)


def host_collective_works(n: int, name: str) -> None:
    got = hvd.allreduce(np.ones(3, np.float32), op=hvd.Sum, name=name)
    np.testing.assert_array_equal(got, np.full(3, n, np.float32))


def nccl_error(r: int, n: int) -> None:
    failing = os.environ["FAILING_RANK"].split(",")  # one rank, or any of several
    error = None
    start = time.monotonic()
    try:
        for step in range(20):
            out = hvd.allreduce(dev(np.full(4, r, np.float32)), op=hvd.Sum, name=f"step.{step}")
            fake.cai_to_numpy(out)
    except hvd.HvdliteError as exc:
        error = str(exc)
    assert error is not None, "no rank saw the NCCL failure"
    assert any(f"rank {q}" in error for q in failing) and "step." in error, error
    print(f"rank {r} error after {time.monotonic() - start:.1f} s: {error[:300]}", flush=True)
    hvd.shutdown()
    os.environ.pop("HVDLITE_FAKE_NCCL_FAIL", None)
    hvd.init()
    # The fake reads its failure settings once per process; later calls are not counted
    # as the N-th again, so the new communicator works.
    got = hvd.allreduce(dev(np.full(4, r, np.float32)), op=hvd.Sum, name="after.failure")
    np.testing.assert_array_equal(fake.cai_to_numpy(got), np.full(4, sum(range(n)), np.float32))


def stalled_peer(r: int, n: int) -> None:
    limit = float(os.environ["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"])
    start = time.monotonic()
    error = None
    try:
        for step in range(20):
            out = hvd.allreduce(dev(np.full(4, r, np.float32)), op=hvd.Sum, name=f"stall.{step}")
            fake.cai_to_numpy(out) if r != int(os.environ["FAILING_RANK"]) else None
    except hvd.HvdliteError as exc:
        error = str(exc)
    waited = time.monotonic() - start
    assert error is not None, "the stalled collective was never reported"
    assert "did not finish on the GPU" in error, error
    assert waited < limit + 20, f"took {waited:.1f} s with a stall limit of {limit} s"
    print(f"rank {r} failed after {waited:.1f} s: {error[:300]}", flush=True)


def missing_library(r: int, n: int, what: str) -> None:
    try:
        hvd.allreduce(dev(np.ones(4, np.float32)), name="gpu.without.library")
    except hvd.HvdliteError as exc:
        msg = str(exc)
        assert "gpu.without.library" in msg and what in msg and "Searched" in msg, msg
    else:
        raise AssertionError("a GPU collective ran without its library")
    host_collective_works(n, "host.still.works")


def main() -> None:
    scenario = sys.argv[1]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if scenario == "nccl_error":
        nccl_error(r, n)
    elif scenario == "stalled_peer":
        stalled_peer(r, n)
    elif scenario == "missing_nccl":
        missing_library(r, n, "NCCL")
    elif scenario == "missing_runtime":
        missing_library(r, n, "CUDA runtime")
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(f"{scenario} OK rank {r}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
