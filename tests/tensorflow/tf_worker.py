"""Launched on N ranks by test_tf_adapter.py: runs every registered TensorFlow/Keras check
and writes OUT_DIR/rank{r}.json mapping check name -> "ok" or the failure description.

Usage: tf_worker.py OUT_DIR [CHECK_NAME ...]   (names restrict the run, for debugging)
"""
from __future__ import annotations

import tf_checks_common as common  # initialises hvdlite and TensorFlow threads
import tf_ops_checks  # noqa: F401  (registers checks)
import tf_keras_checks  # noqa: F401  (registers checks)

if __name__ == "__main__":
    common.run_checks()
