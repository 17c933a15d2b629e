"""Run ``digits_function.train`` on N ranks with ``hvdlite.run``, as the Ray and Spark
examples do through their engines::

    python examples/pytorch/run_digits_function.py --num-proc 2
"""
from __future__ import annotations

import argparse
import os
import sys

import cloudpickle

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import digits_function  # noqa: E402

import hvdlite  # noqa: E402

# The function travels by value: the ranks need not find this folder.
cloudpickle.register_pickle_by_value(digits_function)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-params", default=None, help="write rank 0's parameters here (.npy)")
    args = parser.parse_args()
    results = hvdlite.run(digits_function.train, kwargs={"epochs": args.epochs, "seed": args.seed},
                          num_proc=args.num_proc)
    digits_function.report(results, "hvdlite.run", args.save_params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
