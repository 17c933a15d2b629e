"""Set-up for every test."""
from __future__ import annotations

import os

import pytest

from hvdlite.runner.session_dirs import remove_stale_session_dirs


@pytest.fixture(autouse=True)
def _no_session_dirs_of_killed_jobs():
    """Tests kill jobs (timeouts, faults), and a killed Open MPI process leaves its
    session folder behind, which makes a later mpirun that gets the same process id
    fail at start (see :mod:`hvdlite.runner.session_dirs`). ``hvdlite-run`` removes
    such folders itself; this does it for the tests that start ``mpirun`` directly."""
    remove_stale_session_dirs(os.environ)
    yield
