"""Train the digits MLP of ``examples/pytorch/digits_function.py`` on a Ray cluster with
``hvdlite.ray.RayExecutor`` (Horovod's API): one Ray actor per worker, each paired with
an MPI rank that keeps its state between calls.

On this machine (a Ray instance of its own)::

    python examples/ray/train_digits_ray.py --num-workers 2

On a running cluster, from one of its nodes: ``--address auto`` (or the head's
``host:port``), and ``--num-hosts 2 --workers-per-host 2`` to spread the workers.
"""
from __future__ import annotations

import argparse
import os
import sys

import cloudpickle
import ray

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pytorch"))
import digits_function  # noqa: E402

from hvdlite.ray import RayExecutor  # noqa: E402

cloudpickle.register_pickle_by_value(digits_function)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="a running cluster (default: start one here)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--num-hosts", type=int, default=None)
    parser.add_argument("--workers-per-host", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-params", default=None, help="write rank 0's parameters here (.npy)")
    args = parser.parse_args()

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=max(args.num_workers, 1), include_dashboard=False)
    settings = RayExecutor.create_settings(timeout_s=120)
    if args.num_hosts:
        executor = RayExecutor(settings, num_hosts=args.num_hosts,
                               num_workers_per_host=args.workers_per_host)
    else:
        executor = RayExecutor(settings, num_workers=args.num_workers)
    executor.start()
    try:
        results = executor.run(digits_function.train,
                               kwargs={"epochs": args.epochs, "seed": args.seed})
    finally:
        executor.shutdown()
    digits_function.report(results, "RayExecutor", args.save_params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
