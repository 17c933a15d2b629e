"""``hvdlite.run(func, ...)``, Horovod's function API of the launcher, through the real
``mpirun``: results come back by rank, a rank's exception comes back as an error naming
the rank, and what hvdlite cannot do is refused before anything is launched."""
from __future__ import annotations

import re
import socket

import numpy as np
import pytest

import hvdlite
from hvdlite.runner.function import Driver, receive_message, send_message


def allreduce_rank(scale: float, *, offset: int = 0) -> tuple[int, int, list[float]]:
    """A module-level function: it travels by reference (the ranks import this module)."""
    import hvdlite as hvd
    hvd.init()
    try:
        x = np.full(3, hvd.rank() + offset, np.float64)
        return hvd.rank(), hvd.size(), (hvd.allreduce(x, op=hvd.Sum) * scale).tolist()
    finally:
        hvd.shutdown()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_results_come_back_by_rank(n: int) -> None:
    got = hvdlite.run(allreduce_rank, args=(0.5,), kwargs={"offset": 1}, num_proc=n)
    total = sum(r + 1 for r in range(n)) * 0.5
    assert got == [(r, n, [total] * 3) for r in range(n)]


@pytest.mark.timeout(180)
def test_closures_travel_by_value_and_np_is_deprecated() -> None:
    table = {"a": 3}

    def local(word: str) -> str:  # not importable on the ranks: pickled by value
        import hvdlite as hvd
        hvd.init()
        out = f"{word}{hvd.rank()}:{table['a']}"
        hvd.shutdown()
        return out

    with pytest.warns(DeprecationWarning, match="num_proc"):
        got = hvdlite.run(local, ("r",), np=2)
    assert got == ["r0:3", "r1:3"]


def read_note() -> str:
    import os
    return os.environ["RUN_NOTE"]


def test_mpi_args_are_split_as_a_shell_would() -> None:
    """A quoted value with a space stays one argument of mpirun."""
    assert hvdlite.run(read_note, num_proc=1, mpi_args="-x 'RUN_NOTE=two words'") == ["two words"]


def fail_on_rank_one() -> int:
    import hvdlite as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one has bad data")
    hvd.barrier()  # on rank 0 this fails, or the job is torn down, once rank 1 is gone
    return 0


@pytest.mark.timeout(180)
def test_an_exception_on_one_rank_is_raised_with_its_traceback() -> None:
    with pytest.raises(RuntimeError) as info:
        hvdlite.run(fail_on_rank_one, num_proc=2)
    text = str(info.value)
    # Rank 0 may report the lost peer as well, before the job is torn down.
    assert re.search(r"fail_on_rank_one raised on rank\(s\) (0, )?1:", text), text
    assert "--- rank 1 ---" in text and "ValueError: rank one has bad data" in text, text
    # The driver is usable again afterwards.
    assert hvdlite.run(allreduce_rank, (1.0,), num_proc=2)[1][2] == [1.0] * 3


@pytest.mark.parametrize("kwargs, what", [
    ({"min_num_proc": 1}, "hvdlite-run --min-np"), ({"max_np": 4}, "elastic"),
    ({"host_discovery_script": "discover.sh"}, "elastic"),
    ({"use_gloo": True}, "MPI only")])
def test_what_hvdlite_lacks_is_refused_before_launching(kwargs: dict, what: str) -> None:
    with pytest.raises(NotImplementedError, match=what):
        hvdlite.run(allreduce_rank, (1.0,), num_proc=2, **kwargs)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_proc must be at least 1"):
        hvdlite.run(allreduce_rank, num_proc=0)
    with pytest.raises(TypeError, match="must be callable"):
        hvdlite.run("train.py", num_proc=1)


def test_the_driver_serves_only_connections_with_its_key() -> None:
    """A connection without the job's key gets nothing and is not read further; one with
    it gets the payload and may report a result."""
    driver = Driver(b"payload", 1, "127.0.0.1")
    try:
        with socket.create_connection(("127.0.0.1", driver.port), timeout=10) as s:
            send_message(s, b"wrong-key 0")
            assert s.recv(1) == b""  # closed without an answer
        with socket.create_connection(("127.0.0.1", driver.port), timeout=10) as s:
            send_message(s, f"{driver.key} 0".encode())
            assert receive_message(s) == b"payload"
            import cloudpickle
            send_message(s, cloudpickle.dumps(("ok", 42)))
    finally:
        driver.close()
    assert driver.rejected == 1 and driver.results == {0: 42}
