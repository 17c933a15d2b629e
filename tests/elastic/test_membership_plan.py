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


@pytest.fixture
def relaunchable(monkeypatch: pytest.MonkeyPatch, world):
    """A world whose state can be saved, under a launcher that reads the ranks' output
    (and has them keep their commits), started on ``allocation``; returns settings with
    ``--max-np`` ``max_np``."""
    def make(hosts: list[str], offered: list[tuple[str, int]], allocation: str, max_np: int = 8):
        s = world(hosts, offered)
        s.max_np = max_np
        monkeypatch.setenv("HVDLITE_LAUNCHER_REQUESTS", "1")
        monkeypatch.setenv("HVDLITE_ELASTIC_KEEP", "k")
        monkeypatch.setenv("HVDLITE_ELASTIC_ALLOCATION", allocation)
        monkeypatch.setattr(membership._world, "relaunchable", True)
        monkeypatch.setattr(membership._world, "blacklist", {})
        monkeypatch.setattr(membership._world, "ignored", set())
        return s
    return make


def test_a_new_host_starts_the_job_again_with_rank_0s_host_first(relaunchable) -> None:
    s = relaunchable(["b", "a"], [("a", 2), ("b", 1), ("c", 2)], "a:2,b:1")
    assert membership.plan_relaunch(s, 2) == [("b", 1), ("a", 2), ("c", 2)]


def test_the_new_job_is_cut_at_max_np_and_needs_more_workers(relaunchable) -> None:
    s = relaunchable(["a", "b"], [("a", 1), ("b", 1), ("c", 4)], "a:1,b:1", max_np=3)
    assert membership.plan_relaunch(s, 2) == [("a", 1), ("b", 1), ("c", 1)]
    s = relaunchable(["a", "b"], [("a", 1), ("b", 1), ("c", 4)], "a:1,b:1", max_np=2)
    assert membership.plan_relaunch(s, 2) is None


def test_no_start_again_without_a_new_host_or_where_it_cannot_be_done(relaunchable, monkeypatch) -> None:
    s = relaunchable(["a", "b"], [("a", 4), ("b", 4)], "a:1,b:1")
    assert membership.plan_relaunch(s, 2) is None  # more slots on known hosts: they grow in place
    s = relaunchable(["a", "b"], [("b", 1), ("c", 1)], "a:1,b:1")
    assert membership.plan_relaunch(s, 2) is None  # rank 0's host is no longer offered
    s = relaunchable(["a", "b"], [("a", 1), ("b", 1), ("c", 1)], "a:1,b:1")
    membership._world.blacklist["c"] = float("inf")
    assert membership.plan_relaunch(s, 2) is None
    s = relaunchable(["a", "b"], [("a", 1), ("b", 1), ("c", 1)], "a:1,b:1")
    monkeypatch.setattr(membership._world, "relaunchable", False)  # a state that cannot be saved
    assert membership.plan_relaunch(s, 2) is None
    monkeypatch.setattr(membership._world, "relaunchable", True)
    monkeypatch.delenv("HVDLITE_LAUNCHER_REQUESTS")  # the launcher does not read the output
    assert membership.plan_relaunch(s, 2) is None


def test_only_states_that_save_what_they_snapshot_can_start_again() -> None:
    from hvdlite.common.elastic import ObjectState, can_snapshot

    class Counts(ObjectState):
        pass

    class Extra(ObjectState):
        def save(self) -> None:
            super().save()

    bcast = lambda obj: obj  # noqa: E731
    assert can_snapshot(ObjectState(bcast, lambda: 0, epoch=1))
    assert can_snapshot(Counts(bcast, lambda: 0, epoch=1))
    assert not can_snapshot(Extra(bcast, lambda: 0, epoch=1))
    state = ObjectState(bcast, lambda: 0, epoch=3, batch=5)
    other = ObjectState(bcast, lambda: 0, epoch=0, batch=0)
    other.load_snapshot(state.snapshot())
    assert (other.epoch, other.batch) == (3, 5)


def _one_rank_on_h1(tmp_path, monkeypatch, resume: str) -> None:
    """A world of one rank on h1 that starts again (``resume``), with kept commits in
    ``tmp_path``."""
    import tempfile

    from hvdlite.common import basics
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("HVDLITE_ELASTIC_KEEP", "k")
    monkeypatch.setenv("HVDLITE_ELASTIC_RESUME", resume)
    monkeypatch.setattr(membership, "hostname", lambda: "h1")
    monkeypatch.setattr(basics, "rank", lambda: 0)
    monkeypatch.setattr(basics, "size", lambda: 1)
    monkeypatch.setattr(membership._world, "resume_checked", False)
    monkeypatch.setattr(membership._world, "blacklist", {})


def test_a_job_started_again_takes_the_kept_commit_and_the_blacklist(tmp_path, monkeypatch) -> None:
    """What the first rank on h1 kept at its last commit: the state, the commit count,
    the resets so far, and the hosts still blacklisted (a failed host that the script
    lists must not come back)."""
    import time

    from hvdlite.common import kept_commits
    from hvdlite.common.elastic import ObjectState

    _one_rank_on_h1(tmp_path, monkeypatch, "joined=h3")
    saved = ObjectState(lambda obj: obj, lambda: 0, epoch=4, batch=16)
    kept_commits.keep("h1", saved.snapshot(), 9, 2, {"h2": float("inf"), "h4": 30.0})
    assert kept_commits.flush() is None
    assert [p.name for p in tmp_path.iterdir()] == ["hvdlite-commit-k-h1.pickle"]
    state = ObjectState(lambda obj: obj, lambda: 0, epoch=0, batch=0)
    assert membership.resume(state) == 2
    assert (state.epoch, state.batch, state._commits) == (4, 16, 9)
    assert membership.take_resumed() == ("joined", ["h3"])
    assert membership._world.blacklist["h2"] == float("inf")
    assert 25 < membership._world.blacklist["h4"] - time.monotonic() <= 30
    assert membership.resume(state) == 0  # once per process: nothing more to load
    kept_commits.discard("h1")
    assert not list(tmp_path.iterdir())


def test_a_job_started_again_without_a_lost_host_counts_a_reset_and_blacklists_it(tmp_path,
                                                                                   monkeypatch) -> None:
    from hvdlite.common import kept_commits
    from hvdlite.common.elastic import ObjectState

    _one_rank_on_h1(tmp_path, monkeypatch, "lost=h3")
    kept_commits.keep("h1", ObjectState(lambda obj: obj, lambda: 0, epoch=2).snapshot(), 5, 1, {})
    assert kept_commits.flush() is None
    state = ObjectState(lambda obj: obj, lambda: 0, epoch=0)
    assert membership.resume(state) == 2
    assert (state.epoch, state._commits) == (2, 5)
    assert membership._world.blacklist["h3"] == float("inf")  # no cooldown range: for good
    assert membership.take_resumed() == ("lost", ["h3"])


def test_without_a_kept_commit_a_lost_host_starts_over_and_a_joined_one_fails(tmp_path, monkeypatch) -> None:
    from hvdlite.common.elastic import ObjectState

    _one_rank_on_h1(tmp_path, monkeypatch, "lost=h3")
    state = ObjectState(lambda obj: obj, lambda: 0, epoch=0)
    assert membership.resume(state) == 1  # nothing was committed: from the start
    assert (state.epoch, state._commits) == (0, 0)
    _one_rank_on_h1(tmp_path, monkeypatch, "joined=h3")
    with pytest.raises(membership.ElasticJobError, match="cannot start again from its last commit: no host kept it"):
        membership.resume(state)


def test_a_kept_commit_that_cannot_be_read_ends_the_job(tmp_path, monkeypatch) -> None:
    from hvdlite.common.elastic import ObjectState

    _one_rank_on_h1(tmp_path, monkeypatch, "lost=h3")
    (tmp_path / "hvdlite-commit-k-h1.pickle").write_bytes(b"not a pickle")
    with pytest.raises(membership.ElasticJobError, match="cannot read the commit kept on h1"):
        membership.resume(ObjectState(lambda obj: obj, lambda: 0, epoch=0))
