"""Horovod's process sets through the real launcher: static sets given to ``init``,
sets from mpi4py communicators, and dynamic sets added and removed at run time; each
collective checked against NumPy on the set's members (see
``workers/process_sets_worker.py``)."""
from __future__ import annotations

import pytest

from tests.torch.torch_mp import assert_passed, run_ranks

STATIC = ["static_collectives", "sets_do_not_wait_for_each_other", "optimizer_on_a_set", "errors"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [3, 4])
def test_static_sets_run_every_collective_beside_the_global_set(n: int) -> None:
    out = run_ranks(n, "process_sets_worker.py", "static", str(n), timeout=200)
    assert_passed(out, n, STATIC)


@pytest.mark.timeout(240)
def test_dynamic_sets_are_added_used_and_removed() -> None:
    out = run_ranks(4, "process_sets_worker.py", "dynamic", timeout=200,
                    env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    assert_passed(out, 4, ["dynamic_add_use_remove"])


@pytest.mark.timeout(240)
def test_sets_from_mpi4py_communicators() -> None:
    out = run_ranks(4, "process_sets_worker.py", "comm", timeout=200)
    assert_passed(out, 4, ["sets_from_communicators"])
