"""Rank 0's plans between two worlds, without a job: which workers leave when the
discovery output changes, and which names are one host."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from hvdlite.common import membership


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch):
    """Sets the running workers' hosts (by rank) and what the discovery script offers."""
    def make(hosts: list[str], offered: list[tuple[str, int]] | None):
        monkeypatch.setattr(membership._world, "hosts", list(hosts))
        monkeypatch.setattr(membership, "_discovered", lambda s: None if offered is None else list(offered))
        return SimpleNamespace(discovery_script="discover.sh")
    return make


def test_the_workers_of_a_host_that_left_leave(world) -> None:
    s = world(["a", "b", "b", "c"], [("a", 1), ("c", 1)])
    assert membership.plan_leaving(s) == [1, 2]


def test_fewer_slots_on_a_host_stop_its_highest_ranks(world) -> None:
    s = world(["a", "b", "a", "b", "a"], [("a", 1), ("b", 2)])
    assert membership.plan_leaving(s) == [2, 4]


def test_nobody_leaves_while_every_slot_is_listed(world) -> None:
    s = world(["a", "b", "b"], [("b", 4), ("a", 1), ("new", 8)])
    assert membership.plan_leaving(s) == []


@pytest.mark.parametrize("offered", [[], [("x", 2), ("y", 2)], None])
def test_a_listing_that_would_stop_everyone_stops_nobody(world, offered) -> None:
    """An empty list, one naming none of the workers' hosts, or no answer yet from the
    script: taken for a broken script, not the end of every host."""
    s = world(["a", "b"], offered)
    assert membership.plan_leaving(s) == []


def test_without_a_discovery_script_nobody_leaves(world) -> None:
    world(["a", "b"], [("a", 1)])
    assert membership.plan_leaving(SimpleNamespace(discovery_script="")) == []


def test_host_names_compare_without_their_domain_but_addresses_whole(world) -> None:
    assert membership._same_host("node1.cluster.example", "node1")
    assert not membership._same_host("node1.cluster", "node2.cluster")
    assert not membership._same_host("10.0.1.5", "10.0.2.5")
    assert membership._same_host("10.0.1.5", "10.0.1.5")
    s = world(["node1", "node2"], [("node1.cluster", 1), ("10.0.0.2", 1)])
    assert membership.plan_leaving(s) == [1]
