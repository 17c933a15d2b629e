"""The fault tests' emulated hosts: 3 of them, one per test module (they need root;
the tests are skipped with the reason otherwise)."""
from __future__ import annotations

import pytest

from tests.hosts.emulated import EmulatedHosts, unavailable


@pytest.fixture(scope="module")
def hosts():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with EmulatedHosts(3, rate="1gbit") as h:
        yield h
