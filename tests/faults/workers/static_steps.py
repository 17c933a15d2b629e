"""A fixed-size (not elastic) job for the fault tests: every step allreduces a small
array, and each rank prints ``STEP <n> <time> <rank> <host>`` when the step completes,
so the test can see which ranks make progress and inject a fault at a given step.

A rank whose collective fails prints ``FAILED <rank> <host> <time> <message>`` and
exits with status 3, as a training script that lets the error end it does."""
from __future__ import annotations

import socket
import sys
import time

import numpy as np

import hvdlite as hvd


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
    hvd.init()
    host = socket.gethostname()
    x = np.ones(1024, dtype=np.float32)
    for step in range(1, steps + 1):
        try:
            hvd.allreduce(x, name="grad")
        except Exception as exc:  # noqa: BLE001 - the test reads the message
            print(f"FAILED {hvd.rank()} {host} {time.time():.3f} {type(exc).__name__}: {exc}", flush=True)
            return 3
        print(f"STEP {step} {time.time():.3f} {hvd.rank()} {host}", flush=True)
        time.sleep(0.02)
    return 0


if __name__ == "__main__":
    sys.exit(main())
