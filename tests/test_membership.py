"""The split-brain rule of elastic training (hvdlite.common.membership): after losing
workers, who may go on. Pure Python: the world's hosts are set by hand and the daemon
that a stopping side ends is recorded, not signalled."""
from __future__ import annotations

import pytest

from hvdlite.common import membership
from hvdlite.common.exceptions import ElasticJobError


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch):
    ended: list[bool] = []
    monkeypatch.setattr(membership, "_end_host_daemon", lambda: ended.append(True))

    def set_hosts(hosts: list[str]) -> list[bool]:
        monkeypatch.setattr(membership._world, "hosts", list(hosts))
        return ended
    return set_hosts


def test_a_majority_goes_on_after_losing_a_whole_host(world) -> None:
    ended = world(["h1", "h2", "h3"])
    membership._check_majority([2], 3)  # h3 cut off: 2 of 3 are a majority
    membership._check_majority([0], 3)  # rank 0's host: still a majority
    assert ended == []


def test_the_minority_stops_and_ends_its_hosts_daemon(world) -> None:
    ended = world(["h1", "h2", "h3"])
    with pytest.raises(ElasticJobError, match="1 left here are not a majority"):
        membership._check_majority([0, 1], 3)  # what h3 sees of the same partition
    assert ended == [True]


def test_an_even_split_goes_on_on_rank_0s_side_only(world) -> None:
    world(["h1", "h1", "h2", "h2"])
    membership._check_majority([2, 3], 4)  # rank 0's side
    with pytest.raises(ElasticJobError, match="rank 0 is on the other side"):
        membership._check_majority([0, 1], 4)
    # Two workers on two hosts: losing rank 0's host stops the job (a dead host and a
    # cut-off one look the same from here); losing the other host does not.
    world(["h1", "h2"])
    membership._check_majority([1], 2)
    with pytest.raises(ElasticJobError):
        membership._check_majority([0], 2)


def test_processes_that_died_on_a_reachable_host_are_no_partition(world) -> None:
    """Losing workers whose host still has survivors is no partition: the survivors go
    on however few they are (a host's ranks share it, and one of them is here)."""
    ended = world(["h1", "h1", "h1", "h1"])
    membership._check_majority([0, 1, 2], 4)
    world(["h1", "h1", "h2", "h2"])
    membership._check_majority([0, 2], 4)  # one process died on each host, rank 0 among them
    assert ended == []


def test_nothing_to_check_without_the_hosts(world) -> None:
    world(["h1"])
    membership._check_majority([0], 1)
    membership._world.hosts = None
    membership._check_majority([0, 1], 3)
