"""Launched on N ranks by test_tf_graph_ops.py: runs the checks of tf_graph_checks.py
and writes OUT_DIR/rank{r}.json mapping check name -> "ok" or the failure description.

Usage: tf_graph_worker.py OUT_DIR [CHECK_NAME ...]   (names restrict the run)
"""
from __future__ import annotations

import json
import os
import sys
import traceback

import tf_checks_common as common  # initialises hvdlite and TensorFlow threads
import tf_graph_checks  # noqa: F401  (registers checks)


def main() -> None:
    out_dir = sys.argv[1]
    only = set(sys.argv[2:])
    hvd = common.hvd
    results = {}
    for fn in common.CHECKS:
        if only and fn.__name__ not in only:
            continue
        common.FAILURES.clear()
        try:
            fn()
        except Exception:
            common.FAILURES.append("exception:\n" + traceback.format_exc())
        results[fn.__name__] = "ok" if not common.FAILURES else "\n".join(common.FAILURES)
        hvd.allgather_object(fn.__name__)  # keep ranks in step between checks
        # Written after every check: a launch killed by its timeout still reports the
        # checks that finished.
        with open(os.path.join(out_dir, f"rank{common.R}.json"), "w") as f:
            json.dump(results, f, indent=1)
    hvd.shutdown()


if __name__ == "__main__":
    main()
