"""Horovod's helper modules that scripts and test suites import, as hvdlite provides
them: ``horovod.common.util`` (:mod:`hvdlite.common.util`),
``horovod.runner.common.util.env`` (:mod:`hvdlite.runner.rank_env`) and
``horovod.runner.util.threads`` (:mod:`hvdlite.runner.threads`), checked against
Horovod 0.28.1's documented behaviour and against ``hvdlite-run --check-build``'s view
of this install. Under the real launcher, ``get_env_rank_and_size`` agrees with
``hvd.rank()``/``hvd.size()`` (tests/test_horovod_alias.py)."""
from __future__ import annotations

import os
import threading
import time

import pytest

from hvdlite.common import util
from hvdlite.runner import check_build
from hvdlite.runner.rank_env import get_env_rank_and_size
from hvdlite.runner.threads import in_thread, on_event


def test_env_sets_variables_for_the_block_and_restores_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVDLITE_TEST_KEPT", "before")
    monkeypatch.delenv("HVDLITE_TEST_NEW", raising=False)
    monkeypatch.setenv("HVDLITE_TEST_UNTOUCHED", "same")
    with util.env(HVDLITE_TEST_KEPT="inside", HVDLITE_TEST_NEW="1", HVDLITE_TEST_UNTOUCHED=None):
        assert os.environ["HVDLITE_TEST_KEPT"] == "inside"
        assert os.environ["HVDLITE_TEST_NEW"] == "1"
        assert os.environ["HVDLITE_TEST_UNTOUCHED"] == "same"  # None: left alone
    assert os.environ["HVDLITE_TEST_KEPT"] == "before"
    assert "HVDLITE_TEST_NEW" not in os.environ
    assert os.environ["HVDLITE_TEST_UNTOUCHED"] == "same"

    with pytest.raises(KeyError):
        with util.env(HVDLITE_TEST_NEW="2", HVDLITE_TEST_KEPT="again"):
            raise KeyError("the block fails")
    assert "HVDLITE_TEST_NEW" not in os.environ and os.environ["HVDLITE_TEST_KEPT"] == "before"


@pytest.mark.parametrize("ver, target, expected", [
    ("2.13.0+cpu", "2.1.0", True),   # a local version label counts as that release
    ("2.13.0", "2.13.0", True),
    ("1.9.0", "1.10.0", False),      # compared as versions, not as strings
    ("0.28.1", "0.28.0", True),
    ("2.21.0rc1", "2.21.0", False),  # a release candidate comes before the release
])
def test_is_version_greater_equal_than_compares_versions(ver: str, target: str, expected: bool) -> None:
    assert util.is_version_greater_equal_than(ver, target) is expected


def test_is_version_greater_equal_than_refuses_what_horovod_refuses() -> None:
    with pytest.raises(ValueError, match="two strings"):
        util.is_version_greater_equal_than(2.1, "2.1.0")
    with pytest.raises(ValueError, match="major.minor.patch"):
        util.is_version_greater_equal_than("2.1.0", "2.1")


@pytest.mark.parametrize("length, n", [(0, 3), (5, 2), (7, 3), (9, 3), (2, 4), (10, 1)])
def test_split_list_cuts_into_near_equal_consecutive_chunks(length: int, n: int) -> None:
    items = list(range(length))
    chunks = util.split_list(items, n)
    assert len(chunks) == n
    assert [x for chunk in chunks for x in chunk] == items
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert util.split_list([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]


def test_num_rank_is_power_2() -> None:
    powers = {2 ** k for k in range(12)}
    for n in range(-4, 2100):
        assert util.num_rank_is_power_2(n) is (n in powers), n


def test_is_iterable() -> None:
    assert util.is_iterable([1]) and util.is_iterable("ab") and util.is_iterable(x for x in ())
    assert not util.is_iterable(3) and not util.is_iterable(None)


def test_built_probes_report_this_install() -> None:
    """MPI always, never Gloo, DDL or oneCCL; NCCL as the engine finds it here (the
    report of ``hvdlite-run --check-build``, asked in its own child process)."""
    assert util.mpi_built() is True
    assert util.gloo_built() is False and util.ddl_built() is False and util.ccl_built() is False
    gpu = check_build.gpu_status()
    assert gpu is not None
    want = int(gpu["nccl"]["version_code"]) if gpu["nccl"]["loaded"] else 0
    assert util.nccl_built() == want and isinstance(util.nccl_built(), int)


def test_built_probes_say_none_when_the_engine_does_not_load(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(util, "_BUILD_PROBE", "raise SystemExit('the engine does not load')")
    util._engine_build.cache_clear()
    try:
        assert util.mpi_built() is None and util.gloo_built() is None and util.nccl_built() is None
        assert util.mpi_built(verbose=True) is None
        assert "could not be loaded" in capsys.readouterr().out
    finally:
        util._engine_build.cache_clear()


def test_extension_available_tries_hvdlites_front_ends() -> None:
    pytest.importorskip("torch")
    assert util.extension_available("torch") is True
    assert util.extension_available("mxnet") is False       # hvdlite has no MXNet front end
    assert util.extension_available("no_such_front_end") is False
    assert util.extension_available("torch; import os") is False


@pytest.mark.parametrize("variables, expected", [
    ({}, (0, 1)),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}, (3, 4)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, (1, 2)),
    # Horovod's own variables first, then Open MPI's, then PMI's.
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6"}, (0, 8)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3", "PMI_RANK": "0", "PMI_SIZE": "1"}, (2, 3)),
])
def test_get_env_rank_and_size(monkeypatch: pytest.MonkeyPatch, variables: dict[str, str],
                               expected: tuple[int, int]) -> None:
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert get_env_rank_and_size() == expected


def test_get_env_rank_and_size_refuses_half_a_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="HOROVOD_RANK is set but HOROVOD_SIZE is not"):
        get_env_rank_and_size()


def test_in_thread_runs_the_target_in_a_started_thread() -> None:
    seen: list[tuple[str, int]] = []
    thread = in_thread(lambda word, n: seen.append((threading.current_thread().name, n)), args=("x", 7),
                       name="worker")
    thread.join(10)
    assert seen == [("worker", 7)] and thread.daemon
    assert not in_thread(seen.clear, daemon=False).daemon
    with pytest.raises(ValueError, match="tuple"):
        in_thread(print, args=[1])


def test_in_thread_silent_swallows_the_targets_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    reported: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_value))

    def fail() -> None:
        raise RuntimeError("boom")

    in_thread(fail, silent=True).join(10)
    assert reported == []
    in_thread(fail).join(10)
    assert [str(e) for e in reported] == ["boom"]


def test_on_event_calls_after_the_event_unless_stopped() -> None:
    event, called = threading.Event(), []
    thread = on_event(event, called.append, args=("go",))
    time.sleep(0.05)
    assert called == [] and thread.is_alive()
    event.set()
    thread.join(10)
    assert called == ["go"]

    event, stop = threading.Event(), threading.Event()
    thread = on_event(event, called.append, args=("late",), stop=stop, check_stop_interval_s=0.01, daemon=False)
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and called == ["go"]

    with pytest.raises(ValueError, match="stop event"):
        on_event(threading.Event(), print, daemon=False)
    with pytest.raises(ValueError, match="event"):
        on_event(None, print)  # type: ignore[arg-type]
