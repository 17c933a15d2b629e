"""Launched on N ranks by test_tf_graph_ops.py: runs the checks of tf_graph_checks.py
and writes OUT_DIR/rank{r}.json mapping check name -> "ok" or the failure description.

Usage: tf_graph_worker.py OUT_DIR [CHECK_NAME ...]   (names restrict the run)
"""
from __future__ import annotations

import tf_checks_common as common  # initialises hvdlite and TensorFlow threads
import tf_graph_checks  # noqa: F401  (registers checks)

if __name__ == "__main__":
    common.run_checks()
