"""hvdlite-run forwards the ranks' output as it comes (hvdlite/runner/output.py).

Open MPI's mpirun holds a rank's output until its newline, so a progress bar that
redraws itself with ``\\r`` stayed invisible until the rank ended the line. The unit
tests feed the parser and the line multiplexer made-up tagged output; the job tests run
real ranks through ``hvdlite-run`` and read the launcher's stdout while they run.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdlite.runner.command import build_mpirun_command, live_output
from hvdlite.runner.config import LaunchConfig
from hvdlite.runner.output import LineMux, TagParser

from tests.launch import REPO, job_env, kill_tree

TIMEOUT = 120


# ------------------------------------------------------------------ unit: parser and mux


def test_parser_splits_sources_and_holds_a_split_tag() -> None:
    p = TagParser("stdout")
    pieces = p.feed(b"mpirun says hi\n[1,0]<stdout>: a\nb[1,1]<stderr>: \rbar 1[1,")
    assert pieces == [(("mpirun", "stdout"), "stdout", b"mpirun says hi\n"),
                      (("1,0", ""), "stdout", b"a\nb"),
                      (("1,1", ""), "stderr", b"\rbar 1")]
    assert p.holding  # "[1," may be the start of the next tag
    assert p.feed(b"0]<stdout>: more\n") == [(("1,0", ""), "stdout", b"more\n")]
    # Text that only looks like the start of a tag goes out once nothing follows it.
    assert p.feed(b"[1,0]<stdout>: 50% [") == [(("1,0", ""), "stdout", b"50% ")]
    assert p.flush() == [(("1,0", ""), "stdout", b"[")]
    # A tqdm bar's "[00:01<00:02, ...]" is not held back.
    assert p.feed(b"[1,0]<stderr>: \r 3/9 [00:01<00:02") == [
        (("1,0", ""), "stderr", b"\r 3/9 [00:01<00:02")]
    assert not p.holding


class _Screen:
    def __init__(self) -> None:
        self.out, self.err = io.BytesIO(), io.BytesIO()

    def mux(self, shared: bool = True) -> LineMux:
        return LineMux(self.out, self.err, shared=shared)


R0, R1 = ("1,0", ""), ("1,1", "")


def test_mux_shows_a_redrawn_line_at_once_and_holds_a_plain_one() -> None:
    s = _Screen()
    m = s.mux()
    m.write(R0, "stderr", b"\rstep 1")
    assert s.err.getvalue() == b"\rstep 1"  # live
    m.write(R1, "stdout", b"half a li")
    assert s.out.getvalue() == b""  # waits for its newline, as mpirun would
    m.write(R1, "stdout", b"ne\n")
    # Rank 1's whole line ends rank 0's open bar line first.
    assert s.err.getvalue() == b"\rstep 1\n"
    assert s.out.getvalue() == b"half a line\n"
    m.write(R0, "stderr", b"\rstep 2")
    assert s.err.getvalue() == b"\rstep 1\n\rstep 2"


def test_mux_hands_a_ranks_requests_to_the_launcher_and_keeps_them_off_the_screen() -> None:
    s = _Screen()
    got: list[str] = []
    m = LineMux(s.out, s.err, shared=True, requests=(b"[req] ", got.append))
    m.write(R0, "stdout", b"before\n[req] evict rank=1 host=h2 pid=7 start=9\n[re")
    m.write(R0, "stdout", b"q] second\nafter\n")
    assert got == ["evict rank=1 host=h2 pid=7 start=9\n", "second\n"]
    assert s.out.getvalue() == b"before\nafter\n"
    # mpirun's own output is never taken for a request.
    m.write(("mpirun", "stdout"), "stdout", b"[req] not one\n")
    assert s.out.getvalue().endswith(b"[req] not one\n") and len(got) == 2


def test_mux_never_cuts_one_ranks_line_with_anothers() -> None:
    s = _Screen()
    m = s.mux()
    m.write(R0, "stdout", b"rank 0 line 1\nrank 0 li")
    m.write(R1, "stdout", b"rank 1 line 1\nrank 1 line 2\nrank")
    m.write(R0, "stdout", b"ne 2\n")
    m.write(R1, "stdout", b" 1 line 3\n")
    m.close()
    lines = s.out.getvalue().decode().splitlines()
    assert sorted(lines) == sorted(["rank 0 line 1", "rank 0 line 2", "rank 1 line 1",
                                    "rank 1 line 2", "rank 1 line 3"])


def test_mux_second_bar_waits_while_the_first_is_open() -> None:
    s = _Screen()
    m = s.mux()
    m.write(R0, "stderr", b"\rA 1")
    m.write(R1, "stderr", b"\rB 1")
    assert s.err.getvalue() == b"\rA 1"
    m.write(R0, "stderr", b"\rA 2\n")  # rank 0's bar ends its line
    m.write(R1, "stderr", b"\rB 2")
    assert s.err.getvalue() == b"\rA 1\rA 2\n\rB 1\rB 2"
    m.close()


def test_mux_separate_screens_do_not_interfere() -> None:
    s = _Screen()
    m = s.mux(shared=False)
    m.write(R0, "stderr", b"\rbar")
    m.write(R1, "stdout", b"line\n")
    assert s.err.getvalue() == b"\rbar" and s.out.getvalue() == b"line\n"


def test_live_output_only_where_mpirun_can_and_nothing_else_asks() -> None:
    base = LaunchConfig(num_proc=2, command=["true"])
    assert live_output(base, 5, {})
    assert not live_output(base, 4, {})  # Open MPI 4 has no raw output
    assert not live_output(base, 5, {"HVDLITE_LIVE_OUTPUT": "0"})
    assert not live_output(LaunchConfig(num_proc=2, command=["true"], prefix_timestamp=True), 5, {})
    assert not live_output(LaunchConfig(num_proc=2, command=["true"], output_filename="o"), 5, {})
    assert not live_output(LaunchConfig(num_proc=2, command=["true"],
                                        mpi_args=["--output", "tag"]), 5, {})
    argv, _ = build_mpirun_command(base, "mpirun", {"PATH": "/usr/bin"}, is_root=False)
    assert ("--output", "tag:raw") in list(zip(argv, argv[1:]))


# ------------------------------------------------------------------ jobs


def _start(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = job_env(extra_env)
    env.pop("HVDLITE_LIVE_OUTPUT", None)
    return subprocess.Popen([sys.executable, "-m", "hvdlite.runner", *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


BAR_SCRIPT = r"""
import os, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
stream = sys.stderr if sys.argv[2] == "stderr" else sys.stdout
if rank == 0:
    stream.write("\rstep 1/3"); stream.flush()
    # Wait for the test to have seen the unfinished line: with output held until the
    # newline it never does, and this rank gives up after a minute.
    go, deadline = sys.argv[1], time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    stream.write("\rstep 2/3" if os.path.exists(go) else "\rGAVE UP"); stream.flush()
    stream.write("\rstep 3/3\n"); stream.flush()
print(f"rank {rank} done", flush=True)
"""


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_progress_bar_shows_before_its_line_ends(tmp_path: Path, stream: str) -> None:
    script, go = tmp_path / "bar.py", tmp_path / "go"
    script.write_text(BAR_SCRIPT)
    proc = _start("-np", "2", sys.executable, str(script), str(go), stream)
    pipe = proc.stdout if stream == "stdout" else proc.stderr
    assert pipe is not None
    seen = b""
    try:
        deadline = time.monotonic() + TIMEOUT - 10
        while b"\rstep 1/3" not in seen and time.monotonic() < deadline:
            chunk = os.read(pipe.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
        assert b"\rstep 1/3" in seen, seen
        assert proc.poll() is None  # the job is still running: the line came live
        assert b"step 3/3" not in seen
        go.write_text("")
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    rest = seen + (out if stream == "stdout" else err)
    assert b"GAVE UP" not in rest
    # In order (rank 1's line may come between them: it ends the open bar line first).
    steps = [rest.find(b"\rstep 1/3"), rest.find(b"\rstep 2/3"), rest.find(b"\rstep 3/3\n")]
    assert -1 not in steps and steps == sorted(steps), rest
    assert proc.returncode == 0, err
    stdout = (seen if stream == "stdout" else b"") + out
    assert sorted(re.findall(rb"rank (\d) done", stdout)) == [b"0", b"1"]


FLOOD_SCRIPT = r"""
import os
rank = os.environ["OMPI_COMM_WORLD_RANK"]
for i in range(4000):
    # Lines of every length up to 9000 bytes: the pieces mpirun forwards end anywhere.
    print(f"rank {rank} line {i} " + "x" * ((i * 37) % 9000))
"""


@pytest.mark.timeout(TIMEOUT)
def test_many_ranks_printing_at_once_never_cut_each_others_lines(tmp_path: Path) -> None:
    script = tmp_path / "flood.py"
    script.write_text(FLOOD_SCRIPT)
    proc = _start("-np", "3", sys.executable, str(script))
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    assert proc.returncode == 0, err
    seen: dict[str, list[int]] = {"0": [], "1": [], "2": []}
    for line in out.decode().splitlines():
        m = re.fullmatch(r"rank (\d) line (\d+) (x*)", line)
        assert m and len(m.group(3)) == (int(m.group(2)) * 37) % 9000, line[:120]
        seen[m.group(1)].append(int(m.group(2)))
    assert all(v == list(range(4000)) for v in seen.values())
