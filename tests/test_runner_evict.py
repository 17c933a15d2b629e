"""hvdlite-run ending a lost worker's process on rank 0's request: the request's form,
and that only the process with that pid *and* start time is killed, here and through
an agent as on another host."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hvdlite.runner.evict import Evictor, Requests, parse_request

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads processes from /proc")


def _start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _gone(proc: subprocess.Popen, timeout: float = 10) -> bool:
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_a_request_is_parsed_or_refused() -> None:
    assert parse_request("evict rank=2 host=h3 pid=123 start=456\n") == (2, "h3", 123, "456")
    assert parse_request("evict rank=2 host=h3 pid=x start=456") is None
    assert parse_request("rm -rf /") is None


@pytest.mark.parametrize("where", ["here", "through the agent"])
def test_only_the_process_with_that_pid_and_start_time_is_killed(tmp_path: Path, where: str) -> None:
    said: list[str] = []
    env = {}
    host = "localhost"
    if where != "here":
        # An agent as ssh is: host, then the command for a shell there (run here).
        agent = tmp_path / "agent.sh"
        agent.write_text('#!/bin/sh\nhost="$1"; shift\nexec /bin/sh -c "$*"\n')
        agent.chmod(0o755)
        env = {"PRTE_MCA_plm_ssh_agent": str(agent)}
        host = "elsewhere"
    evictor = Evictor(env, said.append)
    keep, victim = _sleeper(), _sleeper()
    try:
        time.sleep(0.2)
        wrong = str(int(_start_time(keep.pid)) + 1)
        evictor.request(f"evict rank=1 host={host} pid={keep.pid} start={wrong}")  # a pid reused since
        evictor.request(f"evict rank=2 host={host} pid={victim.pid} start={_start_time(victim.pid)}")
        assert _gone(victim), "the lost worker's process still runs"
        time.sleep(1.0)
        assert keep.poll() is None, "a process with another start time was killed"
        assert said == [f"ended the process of rank 2 on {host} (pid {victim.pid}), which rank 0 counted lost"], said
    finally:
        evictor.close()
        for p in (keep, victim):
            p.kill()
            p.wait()


def test_a_request_to_start_again_on_more_hosts_is_kept_for_the_launcher() -> None:
    said: list[str] = []
    requests = Requests({}, said.append)
    try:
        requests.handle("relaunch hosts=h1:1,h2:2\n")
        assert requests.relaunch == [("h1", 1), ("h2", 2)]
        assert not requests.finished
        requests.handle("relaunch hosts=h1")  # no slots: refused, the first kept
        assert requests.relaunch == [("h1", 1), ("h2", 2)]
        assert said and "ignored a request to start the job again" in said[0], said
    finally:
        requests.close()


def test_the_hosts_whose_daemon_mpirun_lost_are_read_from_its_messages() -> None:
    """Open MPI's two messages for a lost daemon (PRRTE's help texts), and one about
    something else that also names a remote host."""
    requests = Requests({}, lambda _: None)
    try:
        for line in ["A daemon failed to report back after being spawned. This could",
                     "  Local host:    vm", "  Remote host:   h3", "  Daemon exit status: 137",
                     "PRTE has lost communication with a remote daemon.", "",
                     "  HNP daemon   : [prterun-h1-12@0,0] on node h1",
                     "  Remote daemon: [prterun-h1-12@0,2] on node h2.example.org",
                     "  Remote host:   h4"]:
            requests.runtime_line(line)
        assert requests.lost_hosts == ["h3", "h2.example.org"]
    finally:
        requests.close()
