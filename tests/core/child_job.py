"""Children of a rank: a forked copy keeps the process info but cannot run
collectives (a clear error, no hang, no MPI call), and a spawned child that re-runs
the script's top level is refused by init() instead of posing as its parent's rank."""
import multiprocessing as mp
import os
import sys

import numpy as np

import hvdlite as hvd

hvd.init()  # at the top level on purpose: a spawned child re-runs it
rank, size = hvd.rank(), hvd.size()


def forked_child(conn) -> None:
    report = [hvd.rank(), hvd.size(), hvd.is_initialized()]
    for call in (lambda: hvd.allreduce(np.ones(3), name="from.child"), hvd.barrier, hvd.init):
        try:
            call()
            report.append("no error")
        except hvd.HvdliteError as exc:
            report.append(str(exc))
    conn.send(report)


def spawned_child(conn) -> None:  # never reached: the re-run top level raises first
    conn.send("spawned child ran")


def expect_forked_message(msg: str) -> None:
    assert f"was forked from the process of rank {rank} (pid {os.getpid()})" in msg, msg
    assert "only that process can run collectives" in msg, msg


if __name__ == "__main__":
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        parent, child = ctx.Pipe()
        p = ctx.Process(target=forked_child if method == "fork" else spawned_child, args=(child,))
        p.start()
        p.join(60)
        assert p.exitcode is not None, f"{method} child hung"
        if method == "fork":
            got = parent.recv()
            assert got[:3] == [rank, size, False], got
            for msg in got[3:]:
                expect_forked_message(msg)
            assert p.exitcode == 0, p.exitcode
        else:
            # Its traceback (on stderr) carries the message; the test reads it there.
            assert p.exitcode == 1 and not parent.poll(), (p.exitcode, parent.poll())
    # A plain os.fork() whose child exits through sys.exit runs the atexit handlers:
    # shutting down there must leave the parent's engine alone.
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    got = hvd.allreduce(np.full(3, rank + 1.0), op=hvd.Sum, name="after.children")
    assert np.array_equal(got, np.full(3, size * (size + 1) / 2)), got
    print(f"ALL CHECKS PASSED rank {rank}", flush=True)
