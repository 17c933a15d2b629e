"""Train the digits MLP of ``examples/pytorch/digits_function.py`` on Spark with
``hvdlite.spark.run`` (Horovod's API): one Spark task per rank, started together in
barrier mode.

On this machine (Spark's local mode, one task slot per rank)::

    python examples/spark/train_digits_spark.py --num-proc 2

On a cluster: ``--master spark://HOST:7077`` (or submit it with spark-submit, which
makes the session).
"""
from __future__ import annotations

import argparse
import os
import sys

import cloudpickle
from pyspark.sql import SparkSession

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pytorch"))
import digits_function  # noqa: E402

import hvdlite.spark  # noqa: E402

cloudpickle.register_pickle_by_value(digits_function)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default=None, help="default: local[NUM_PROC]")
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-params", default=None, help="write rank 0's parameters here (.npy)")
    args = parser.parse_args()

    # The executors run this Python, which has hvdlite and PyTorch.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(args.master or f"local[{args.num_proc}]")
             .appName("hvdlite digits").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        results = hvdlite.spark.run(digits_function.train, num_proc=args.num_proc,
                                    kwargs={"epochs": args.epochs, "seed": args.seed})
    finally:
        spark.stop()
    digits_function.report(results, "hvdlite.spark.run", args.save_params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
