"""Tests for ``hvdlite-run``'s elastic options (the launcher side).

Unit tests, without MPI processes: the discovery-script format and running real
scripts (:mod:`hvdlite.common.discovery`), the elastic settings' round trip through
the environment, the mpirun command built in elastic mode, the usage errors, and
the wait for enough slots.  One integration test starts a real 3-rank job without
elastic options and checks that a rank killed by SIGKILL ends the whole job.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from hvdlite.common import discovery
from hvdlite.common.discovery import (
    DiscoveryError,
    ElasticSettings,
    parse_discovery_output,
    parse_host_slots,
    run_discovery_script,
)
from hvdlite.runner import cli
from hvdlite.runner.cli import parse_args
from hvdlite.runner.config import LaunchConfig
from hvdlite.runner.hosts import elastic_settings, wait_for_slots
from hvdlite.runner.mpirun import LaunchError
from tests.launch import run_job
from tests.test_runner import _build, _forwarded, _pairs


def _triples(argv: list[str]) -> list[tuple[str, str, str]]:
    return list(zip(argv, argv[1:], argv[2:]))


def _script(path: Path, body: str, executable: bool = True) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    mode = path.stat().st_mode
    path.chmod(mode | stat.S_IXUSR if executable else mode & ~(stat.S_IXUSR | stat.S_IXGRP
                                                               | stat.S_IXOTH))
    return path


# ----------------------------------------------------------------- discovery output


def test_parse_discovery_output() -> None:
    text = "\n  node1:4  \n\nnode2 : 2\nnode3\n\t\n"
    assert parse_discovery_output(text, 8) == [("node1", 4), ("node2", 2), ("node3", 8)]
    # The order of the script is kept; host:slots wins over the default.
    assert parse_discovery_output("b:1\na:3\n", 2) == [("b", 1), ("a", 3)]
    assert parse_discovery_output("", None) == []
    assert parse_discovery_output("\n \n", 1) == []
    assert parse_discovery_output("10.0.0.5:2\nhost-1.example.org:1", None) == [
        ("10.0.0.5", 2), ("host-1.example.org", 1)]


@pytest.mark.parametrize("text, default, message", [
    ("node1:4\nnode2\n", None, r"line 2 \('node2'\): no slots given"),
    ("a:0", 1, r"line 1 \('a:0'\): slots must be a positive integer, got 0"),
    ("a:-2", 1, "slots must be a positive integer"),
    ("\n\na:x", 1, r"line 3 \('a:x'\): slots must be a positive integer, got 'x'"),
    ("a:", 1, "slots must be a positive integer"),
    ("a:2\nb:1\na:1", None, r"line 3 \('a:1'\): host 'a' is listed twice \(first in line 1"),
    ("a\na", 2, "listed twice"),
    (":3", 1, r"line 1 \(':3'\): no host name"),
    ("a b:1", 1, "cannot contain spaces"),
])
def test_parse_discovery_output_errors(text: str, default: int | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_discovery_output(text, default)


def test_parse_host_slots() -> None:
    assert parse_host_slots("h1:2,h2:3") == [("h1", 2), ("h2", 3)]
    assert parse_host_slots("") == []
    for bad, message in (("h1:2,,h2:1", "empty entry"), ("h1", "no slots"),
                         ("h1:2,h1:2", "listed twice"), ("h1:0", "positive")):
        with pytest.raises(ValueError, match=message):
            parse_host_slots(bad)


# ----------------------------------------------------------------- running scripts


def test_run_discovery_script_executable(tmp_path: Path) -> None:
    script = _script(tmp_path / "hosts.sh", "echo node1:2\necho\necho '  node2  '\n")
    assert run_discovery_script(str(script), 3) == [("node1", 2), ("node2", 3)]


def test_run_discovery_script_not_executable_runs_with_sh(tmp_path: Path) -> None:
    script = _script(tmp_path / "hosts.sh", "echo a:1; echo b:1\n", executable=False)
    assert not os.access(script, os.X_OK)
    assert run_discovery_script(str(script), None) == [("a", 1), ("b", 1)]


def test_run_discovery_script_failure_reports_status_and_stderr(tmp_path: Path) -> None:
    script = _script(tmp_path / "bad.sh", "echo node1:2\n"
                                          "for i in $(seq 1 500); do echo noise $i >&2; done\n"
                                          "echo 'cloud API said no' >&2\nexit 3\n")
    with pytest.raises(DiscoveryError) as info:
        run_discovery_script(str(script), None)
    message = str(info.value)
    assert "exited with status 3" in message and str(script) in message
    assert "cloud API said no" in message  # the tail of stderr ...
    assert "noise 1\n" not in message      # ... not all of it
    silent = _script(tmp_path / "silent.sh", "exit 1\n")
    with pytest.raises(DiscoveryError, match="status 1 and wrote nothing to stderr"):
        run_discovery_script(str(silent), None)


def test_run_discovery_script_timeout(tmp_path: Path) -> None:
    script = _script(tmp_path / "slow.sh", "exec sleep 30\n")
    start = time.monotonic()
    with pytest.raises(DiscoveryError, match="did not finish within 0.5 s"):
        run_discovery_script(str(script), 1, timeout=0.5)
    assert time.monotonic() - start < 10


def test_run_discovery_script_missing_bad_output(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match="does not exist"):
        run_discovery_script(str(tmp_path / "nope.sh"), 1)
    with pytest.raises(DiscoveryError, match="is not a file"):
        run_discovery_script(str(tmp_path), 1)
    script = _script(tmp_path / "odd.sh", "echo node1\n")
    with pytest.raises(DiscoveryError, match="bad host list.*no slots given"):
        run_discovery_script(str(script), None)
    assert issubclass(DiscoveryError, RuntimeError)


# ----------------------------------------------------------------- settings <-> env


def test_settings_round_trip_full() -> None:
    settings = ElasticSettings(min_np=2, max_np=8, discovery_script="/opt/d.sh",
                               default_slots=4, timeout_s=12.5, reset_limit=3,
                               cooldown_range=(10.0, 100.0), hosts=None)
    env = settings.to_environ()
    assert env == {
        "HVDLITE_ELASTIC": "1", "HOROVOD_ELASTIC": "1",
        "HVDLITE_ELASTIC_MIN_NP": "2", "HVDLITE_ELASTIC_MAX_NP": "8",
        "HVDLITE_ELASTIC_DISCOVERY_SCRIPT": "/opt/d.sh", "HVDLITE_ELASTIC_SLOTS": "4",
        "HVDLITE_ELASTIC_TIMEOUT": "12.5", "HVDLITE_ELASTIC_RESET_LIMIT": "3",
        "HVDLITE_ELASTIC_COOLDOWN": "10,100",
    }
    assert ElasticSettings.from_environ({**env, "PATH": "/bin"}) == settings


def test_settings_round_trip_fixed_hosts() -> None:
    settings = ElasticSettings(min_np=1, max_np=3, hosts=[("h1", 2), ("h2", 1)])
    env = settings.to_environ()
    assert env["HVDLITE_ELASTIC_HOSTS"] == "h1:2,h2:1"
    assert env["HVDLITE_ELASTIC_TIMEOUT"] == "600"
    for absent in ("HVDLITE_ELASTIC_DISCOVERY_SCRIPT", "HVDLITE_ELASTIC_SLOTS",
                   "HVDLITE_ELASTIC_RESET_LIMIT", "HVDLITE_ELASTIC_COOLDOWN"):
        assert absent not in env
    back = ElasticSettings.from_environ(env)
    assert back == settings
    assert back is not None and back.reset_limit is None and back.cooldown_range is None


def test_settings_from_environ_switch_and_errors() -> None:
    full = ElasticSettings(min_np=1, max_np=2, hosts=[("h", 2)]).to_environ()
    assert ElasticSettings.from_environ({"PATH": "/bin"}) is None
    assert ElasticSettings.from_environ({**full, "HVDLITE_ELASTIC": "0"}) is None
    # Horovod's name alone switches it on; hvdlite's name, when set, decides.
    only_horovod = {k: v for k, v in full.items() if k != "HVDLITE_ELASTIC"}
    assert ElasticSettings.from_environ(only_horovod) == ElasticSettings(
        min_np=1, max_np=2, hosts=[("h", 2)])
    assert ElasticSettings.from_environ({**full, "HOROVOD_ELASTIC": "0"}) is not None
    with pytest.raises(ValueError, match="HVDLITE_ELASTIC_MIN_NP"):
        ElasticSettings.from_environ({"HVDLITE_ELASTIC": "1", "HVDLITE_ELASTIC_MAX_NP": "2"})
    for name, value, message in (
            ("HVDLITE_ELASTIC_MAX_NP", "x", "not an integer"),
            ("HVDLITE_ELASTIC_MIN_NP", "0", ">= 1"),
            ("HVDLITE_ELASTIC_MIN_NP", "5", "below HVDLITE_ELASTIC_MIN_NP"),
            ("HVDLITE_ELASTIC_COOLDOWN", "5", "min,max"),
            ("HVDLITE_ELASTIC_COOLDOWN", "9,1", "min is above max"),
            ("HVDLITE_ELASTIC_TIMEOUT", "soon", "not a number"),
            ("HVDLITE_ELASTIC_RESET_LIMIT", "-1", ">= 0"),
            ("HVDLITE_ELASTIC_HOSTS", "h:2,h:1", "HVDLITE_ELASTIC_HOSTS.*listed twice")):
        with pytest.raises(ValueError, match=message):
            ElasticSettings.from_environ({**full, name: value})


# ----------------------------------------------------------------- the mpirun command


def _elastic(**kw) -> LaunchConfig:
    kw.setdefault("num_proc", 2)
    kw.setdefault("command", ["python", "train.py"])
    return LaunchConfig(**kw)


def test_elastic_command_with_discovery_script() -> None:
    config = _elastic(num_proc=3, min_np=2, max_np=6, host_discovery_script="/opt/hosts.sh",
                      elastic_timeout=45, reset_limit=2, cooldown_range=(5.0, 50.0))
    environ = {"PATH": "/usr/bin", "HVDLITE_ELASTIC_HOSTS": "stale:9",
               "HVDLITE_ELASTIC_RESET_LIMIT": "77"}
    argv, env = _build(config, environ, host_list=[("node1", 2), ("node2", 2), ("node3", None)])
    pairs, triples = _pairs(argv), _triples(argv)
    assert argv[1:3] == ["-np", "3"]
    # Every discovered host with its slots, so that later workers have room.
    assert ("--host", "node1:2,node2:2,node3:1") in pairs
    assert ("--with-ft", "ulfm") in pairs
    assert ("--mca", "pml", "ob1") in triples and ("--mca", "btl", "sm,tcp,self") in triples
    # Remote hosts: their slots are respected, no oversubscription.
    assert ":OVERSUBSCRIBE" not in argv and "--oversubscribe" not in argv
    assert env["HVDLITE_ELASTIC"] == env["HOROVOD_ELASTIC"] == "1"
    assert env["HVDLITE_ELASTIC_MIN_NP"] == "2" and env["HVDLITE_ELASTIC_MAX_NP"] == "6"
    assert env["HVDLITE_ELASTIC_DISCOVERY_SCRIPT"] == "/opt/hosts.sh"
    assert env["HVDLITE_ELASTIC_TIMEOUT"] == "45"
    assert env["HVDLITE_ELASTIC_RESET_LIMIT"] == "2"  # the flag, not the stale variable
    assert env["HVDLITE_ELASTIC_COOLDOWN"] == "5,50"
    assert "HVDLITE_ELASTIC_HOSTS" not in env  # the script is the source of hosts
    assert {"HVDLITE_ELASTIC", "HOROVOD_ELASTIC", "HVDLITE_ELASTIC_MIN_NP",
            "HVDLITE_ELASTIC_MAX_NP", "HVDLITE_ELASTIC_DISCOVERY_SCRIPT",
            "HVDLITE_ELASTIC_TIMEOUT", "HVDLITE_ELASTIC_RESET_LIMIT",
            "HVDLITE_ELASTIC_COOLDOWN"} <= _forwarded(argv)
    assert argv[-2:] == ["python", "train.py"]
    # What the workers read back is what the launcher was asked for.
    assert ElasticSettings.from_environ(env) == ElasticSettings(
        min_np=2, max_np=6, discovery_script="/opt/hosts.sh", timeout_s=45.0, reset_limit=2,
        cooldown_range=(5.0, 50.0))


def test_elastic_defaults_local() -> None:
    """--max-np alone: -np workers on this machine, --min-np defaults to -np, room for
    --max-np on localhost, oversubscription as for any local launch, 600 s timeout."""
    argv, env = _build(_elastic(num_proc=2, max_np=4))
    assert ("--host", "localhost:4") in _pairs(argv)
    assert ("--map-by", ":OVERSUBSCRIBE") in _pairs(argv)
    assert ("--with-ft", "ulfm") in _pairs(argv)
    assert env["HVDLITE_ELASTIC_MIN_NP"] == "2" and env["HVDLITE_ELASTIC_MAX_NP"] == "4"
    assert env["HVDLITE_ELASTIC_TIMEOUT"] == "600"
    assert env["HVDLITE_ELASTIC_HOSTS"] == "localhost:4"
    # This machine alone: TCP over the loopback only.
    assert ("--mca", "btl_tcp_if_include", "lo") in _triples(argv)
    # Not with remote hosts, nor when the user picked interfaces.
    argv, _ = _build(_elastic(num_proc=2, max_np=4, hosts="node1:2,node2:2"))
    assert "btl_tcp_if_include" not in argv
    argv, _ = _build(_elastic(num_proc=2, max_np=4, network_interfaces=["eth1"]))
    assert ("--mca", "btl_tcp_if_include", "eth1") in _triples(argv) and "lo" not in argv
    # --min-np alone: --max-np defaults to -np; HOROVOD_ELASTIC_TIMEOUT gives the default.
    _, env = _build(_elastic(num_proc=3, min_np=1),
                    {"PATH": "/bin", "HOROVOD_ELASTIC_TIMEOUT": "90"})
    assert (env["HVDLITE_ELASTIC_MIN_NP"], env["HVDLITE_ELASTIC_MAX_NP"]) == ("1", "3")
    assert env["HVDLITE_ELASTIC_TIMEOUT"] == env["HOROVOD_ELASTIC_TIMEOUT"] == "90"
    # The flag wins over HOROVOD_ELASTIC_TIMEOUT, and the Horovod name follows it.
    _, env = _build(_elastic(num_proc=3, min_np=1, elastic_timeout=7.5),
                    {"PATH": "/bin", "HOROVOD_ELASTIC_TIMEOUT": "90"})
    assert env["HVDLITE_ELASTIC_TIMEOUT"] == env["HOROVOD_ELASTIC_TIMEOUT"] == "7.5"


def test_elastic_watches_for_silent_workers() -> None:
    """ULFM's failure detector counts a worker silent for --failure-timeout seconds as
    failed (10 by default, HVDLITE_FAILURE_TIMEOUT otherwise); mpirun's keepalive on its
    daemons, which would end the whole job for one cut-off host, is off."""
    argv, env = _build(_elastic(num_proc=2, max_np=4))
    assert ("--mca", "mpi_ft_detector", "true") in _triples(argv)
    assert ("--mca", "mpi_ft_detector_timeout", "10") in _triples(argv)
    assert ("--mca", "mpi_ft_detector_period", "2.5") in _triples(argv)
    assert ("--mca", "mpi_ft_propagator_with_rbcast", "true") in _triples(argv)
    assert env["PRTE_MCA_oob_tcp_keepalive_time"] == "0" and env["HVDLITE_FAILURE_TIMEOUT"] == "10"
    argv, _ = _build(_elastic(num_proc=2, max_np=4), {"PATH": "/bin", "HVDLITE_FAILURE_TIMEOUT": "6"})
    assert ("--mca", "mpi_ft_detector_timeout", "6") in _triples(argv)
    argv, env = _build(_elastic(num_proc=2, max_np=4, failure_timeout=4.0),
                       {"PATH": "/bin", "HVDLITE_FAILURE_TIMEOUT": "6"})  # the flag wins
    assert ("--mca", "mpi_ft_detector_timeout", "4") in _triples(argv) and env["HVDLITE_FAILURE_TIMEOUT"] == "4"
    # The user's own detector settings are kept; a fixed-size job has no detector.
    argv, _ = _build(_elastic(num_proc=2, max_np=4, mpi_args=["--mca", "mpi_ft_detector", "false"]))
    assert argv.count("mpi_ft_detector") == 1
    argv, env = _build(LaunchConfig(num_proc=2, command=["t"]))
    assert "mpi_ft_detector" not in argv and "PRTE_MCA_oob_tcp_keepalive_time" not in env
    with pytest.raises(LaunchError, match="HVDLITE_FAILURE_TIMEOUT='soon'"):
        _build(_elastic(num_proc=2, max_np=4), {"PATH": "/bin", "HVDLITE_FAILURE_TIMEOUT": "soon"})


def test_elastic_fixed_hosts() -> None:
    argv, env = _build(_elastic(num_proc=3, min_np=2, max_np=5, slots_per_host=2,
                                hosts="node1:1,node2"))
    assert ("--host", "node1:1,node2:2") in _pairs(argv)  # node2 gets --slots-per-host
    assert env["HVDLITE_ELASTIC_HOSTS"] == "node1:1,node2:2"
    assert env["HVDLITE_ELASTIC_SLOTS"] == "2"
    with pytest.raises(LaunchError, match=r"-np 4 exceeds the 3 slots of the hosts given "
                                          r"\(node1:1,node2:2\)"):
        _build(_elastic(num_proc=4, min_np=2, max_np=5, slots_per_host=2,
                        hosts="node1:1,node2"))


def test_elastic_keeps_user_transport() -> None:
    config = _elastic(min_np=1, mpi_args=["--mca", "btl", "tcp,self,vader", "--with-ft", "ulfm"])
    argv, _ = _build(config)
    assert argv.count("--with-ft") == 1
    assert ("--mca", "btl", "tcp,self,vader") in _triples(argv)
    assert ("--mca", "btl", "sm,tcp,self") not in _triples(argv)
    assert ("--mca", "pml", "ob1") in _triples(argv)  # the user chose no pml
    argv, _ = _build(_elastic(min_np=1, mpi_args=["-mca", "pml", "ucx"]))
    assert ("--mca", "pml", "ob1") not in _triples(argv)
    assert ("--mca", "btl", "sm,tcp,self") in _triples(argv)
    assert ("--with-ft", "ulfm") in _pairs(argv)
    # --tcp already chooses the transport: no second pml/btl.
    argv, _ = _build(_elastic(min_np=1, tcp=True))
    assert argv.count("pml") == 1 and argv.count("btl") == 1
    assert ("--with-ft", "ulfm") in _pairs(argv)


def test_elastic_command_errors() -> None:
    with pytest.raises(LaunchError, match="pass the hosts it printed"):
        _build(_elastic(host_discovery_script="/opt/hosts.sh"))
    with pytest.raises(LaunchError, match=r"-np 3 exceeds the 2 slots of the hosts the "
                                          r"discovery script printed \(a:1,b:1\)"):
        _build(_elastic(num_proc=3, min_np=1, host_discovery_script="/opt/hosts.sh"),
               host_list=[("a", 1), ("b", 1)])
    with pytest.raises(LaunchError, match="needs Open MPI 5"):
        _build(_elastic(min_np=1), ompi_major=4)
    with pytest.raises(LaunchError, match="--min-np 3 is above -np 2"):
        _build(_elastic(min_np=3))
    with pytest.raises(LaunchError, match="--max-np 1 is below -np 2"):
        _build(_elastic(max_np=1))
    with pytest.raises(LaunchError, match="--min-np must be a positive integer"):
        _build(_elastic(min_np=0))
    with pytest.raises(LaunchError, match="cooldown-range 9 1"):
        _build(_elastic(min_np=1, cooldown_range=(9.0, 1.0)))
    with pytest.raises(LaunchError, match="HOROVOD_ELASTIC_TIMEOUT='later'"):
        _build(_elastic(min_np=1), {"PATH": "/bin", "HOROVOD_ELASTIC_TIMEOUT": "later"})


def test_without_elastic_options_nothing_elastic() -> None:
    """A plain launch gets no ULFM and no elastic variables, even when the caller's
    environment still has an outer elastic job's."""
    stale = ElasticSettings(min_np=1, max_np=2, hosts=[("h", 2)]).to_environ()
    argv, env = _build(LaunchConfig(num_proc=2, command=["python", "t.py"]),
                       {"PATH": "/usr/bin", **stale})
    assert "--with-ft" not in argv and "pml" not in argv and "btl" not in argv
    assert not any(name.startswith("HVDLITE_ELASTIC") for name in env)
    assert "HOROVOD_ELASTIC" not in env
    assert ElasticSettings.from_environ(env) is None
    plain, _ = _build(LaunchConfig(num_proc=2, command=["python", "t.py"]))
    assert argv == plain


def test_elastic_settings_resolution(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb\n")
    settings = elastic_settings(_elastic(num_proc=2, min_np=1, hostfile=str(hostfile)),
                                {"PATH": "/bin"})
    assert settings.hosts == [("a", 2), ("b", 1)]  # no slots: 1, as mpirun --host counts
    assert (settings.min_np, settings.max_np, settings.timeout_s) == (1, 2, 600.0)
    slurm_env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert elastic_settings(_elastic(max_np=4), slurm_env).hosts == [("n1", 2), ("n2", 2)]
    with pytest.raises(LaunchError, match="needs --min-np"):
        elastic_settings(LaunchConfig(num_proc=2, command=["t"]), {})


# ----------------------------------------------------------------- command line


def test_parse_args_elastic(tmp_path: Path) -> None:
    script = _script(tmp_path / "hosts.sh", "echo localhost:2\n")
    _, config = parse_args(["-np", "2", "--min-num-proc", "1", "--max-num-proc", "4",
                            "--host-discovery-script", str(script), "--slots", "2",
                            "--elastic-timeout", "30", "--reset-limit", "0",
                            "--blacklist-cooldown-range", "10", "20", "--failure-timeout", "7",
                            "python", "t.py"])
    assert config is not None and config.elastic
    assert (config.num_proc, config.min_np, config.max_np) == (2, 1, 4)
    assert config.host_discovery_script == str(script.resolve())
    assert config.slots_per_host == 2 and config.elastic_timeout == 30
    assert config.reset_limit == 0 and config.cooldown_range == (10.0, 20.0)
    assert config.failure_timeout == 7.0
    assert config.command == ["python", "t.py"]
    # Without -np, --min-np is the number to start with (horovodrun's -np is required).
    _, config = parse_args(["--min-np", "3", "--max-np", "5", "--slots-per-host", "1",
                            "--host-discovery-script", str(script), "t"])
    assert config is not None and config.num_proc == 3
    _, config = parse_args(["-np", "2", "python", "t.py"])
    assert config is not None and not config.elastic


@pytest.mark.parametrize("args, message", [
    (["-np", "2", "--min-np", "0", "t"], "--min-np/--min-num-proc: expected a positive integer"),
    (["-np", "2", "--max-np", "x", "t"], "expected a positive integer"),
    (["-np", "2", "--min-np", "3", "t"], "--min-np 3 is above -np 2"),
    (["-np", "4", "--max-np", "3", "t"], "--max-np 3 is below -np 4"),
    (["--max-np", "3", "t"], "in elastic mode -np or --min-np"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "30", "10", "t"],
     "--blacklist-cooldown-range 30 10: MIN is above MAX"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "-1", "10", "t"],
     "expected a finite number >= 0"),
    (["-np", "2", "--min-np", "1", "--elastic-timeout", "-5", "t"], "expected a finite number"),
    (["-np", "2", "--min-np", "1", "--reset-limit", "-1", "t"], "expected an integer >= 0"),
    (["-np", "2", "--min-np", "1", "--slots-per-host", "0", "t"], "positive integer"),
    (["-np", "2", "--host-discovery-script", "/nonexistent/hosts.sh", "t"],
     "/nonexistent/hosts.sh does not exist"),
    (["-np", "2", "--host-discovery-script", "/", "t"], "/ is not a file"),
    (["-np", "2", "--host-discovery-script", "DISCOVER", "-H", "a:2", "t"], "not allowed with"),
    (["-np", "2", "--reset-limit", "3", "t"], "--reset-limit only applies to elastic mode"),
    (["-np", "2", "--slots", "3", "t"], "--slots-per-host only applies to elastic mode"),
    (["-np", "2", "--failure-timeout", "5", "t"], "--failure-timeout only applies to elastic mode"),
    (["-np", "2", "--min-np", "1", "--failure-timeout", "0", "t"], "--failure-timeout"),
])
def test_elastic_usage_errors_exit_2(args: list[str], message: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    script = _script(tmp_path / "hosts.sh", "echo localhost:4\n")
    args = [str(script) if a == "DISCOVER" else a for a in args]
    with pytest.raises(SystemExit) as info:
        cli.main(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and message in err, err


# ----------------------------------------------------------------- waiting for slots


def _growing_script(tmp_path: Path, first: str, later: str, failing_runs: int = 0) -> Path:
    """A discovery script printing ``first`` on its first run and ``later`` after; runs
    2 .. 1 + failing_runs exit 1.  Each run appends a line to ``runs``."""
    runs = tmp_path / "runs"
    return _script(tmp_path / "hosts.sh", f"""
echo run >> {runs}
n=$(wc -l < {runs})
if [ "$n" -eq 1 ]; then printf '{first}'; exit 0; fi
if [ "$n" -le {1 + failing_runs} ]; then echo "temporary failure $n" >&2; exit 1; fi
printf '{later}'
""")


def test_wait_for_slots_until_enough(tmp_path: Path) -> None:
    script = _growing_script(tmp_path, "node1:1\\n", "node1:1\\nnode2:2\\n", failing_runs=1)
    settings = ElasticSettings(min_np=1, max_np=3, discovery_script=str(script), timeout_s=30)
    lines: list[str] = []
    start = time.monotonic()
    hosts = wait_for_slots(settings, 3, poll_s=0.1, log=lines.append)
    assert hosts == [("node1", 1), ("node2", 2)]
    assert (tmp_path / "runs").read_text().count("run") == 3  # too few, a failure, enough
    assert len(lines) == 1 and "for 3 slots" in lines[0] and "offers 1" in lines[0]
    assert time.monotonic() - start < 10
    # Enough at once: one run, no wait announced.
    (tmp_path / "runs").unlink()
    lines.clear()
    assert wait_for_slots(settings, 1, log=lines.append) == [("node1", 1)]
    assert lines == []


def test_wait_for_slots_times_out(tmp_path: Path) -> None:
    script = _script(tmp_path / "hosts.sh", "echo node1:1\n")
    settings = ElasticSettings(min_np=1, max_np=4, discovery_script=str(script), timeout_s=0.6)
    start = time.monotonic()
    with pytest.raises(LaunchError, match=r"-np 2 needs 2 slots, but the host discovery "
                                          r"script offered only 1 \(node1:1\) within "
                                          r"--elastic-timeout 0.6 s"):
        wait_for_slots(settings, 2, poll_s=0.2)
    elapsed = time.monotonic() - start
    assert 0.5 <= elapsed < 10, elapsed


def test_wait_for_slots_fake_clock_and_failures(tmp_path: Path) -> None:
    """Polls once a second by default; a first failure is final, later ones are retried
    and the last is reported at the timeout."""
    now = [0.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    script = _growing_script(tmp_path, "", "", failing_runs=100)
    settings = ElasticSettings(min_np=1, max_np=2, discovery_script=str(script), timeout_s=3)
    with pytest.raises(LaunchError, match=r"(?s)offered only 0 \(no hosts\).*The last run "
                                          r"failed:.*temporary failure 4"):
        wait_for_slots(settings, 1, clock=lambda: now[0], sleep=sleep)
    assert sleeps == [1.0, 1.0, 1.0]
    broken = _script(tmp_path / "broken.sh", "echo boom >&2; exit 4\n")
    settings = ElasticSettings(min_np=1, max_np=2, discovery_script=str(broken), timeout_s=600)
    start = time.monotonic()
    with pytest.raises(LaunchError, match="(?s)exited with status 4.*boom"):
        wait_for_slots(settings, 1)
    assert time.monotonic() - start < 10


def _fake_mpirun(tmp_path: Path) -> tuple[Path, Path]:
    """An ``mpirun`` that records its arguments (one a line) and exits 0."""
    record = tmp_path / "mpirun-args"
    fake = _script(tmp_path / "mpirun", f"""
if [ "$1" = "--version" ]; then echo "fake mpirun"; exit 0; fi
printf '%s\\n' "$@" > {record}
env | grep '^HVDLITE_ELASTIC' | sort > {record}.env
""")
    return fake, record


def test_launch_waits_for_slots_then_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    fake, record = _fake_mpirun(tmp_path)
    script = _growing_script(tmp_path, "node1:1\\n", "node1:1\\nnode2:1\\n")
    monkeypatch.setenv("HVDLITE_MPIRUN", str(fake))
    rc = cli.main(["-np", "2", "--min-np", "1", "--max-np", "4",
                      "--host-discovery-script", str(script), "--elastic-timeout", "20",
                      "python", "t.py"])
    assert rc == 0, capsys.readouterr().err
    argv = record.read_text().splitlines()
    assert ("--host", "node1:1,node2:1") in _pairs(argv)
    assert ("--with-ft", "ulfm") in _pairs(argv)
    assert "waiting up to 20 s (--elastic-timeout) for 2 slots" in capsys.readouterr().err
    env = dict(line.split("=", 1) for line in record.with_suffix(".env").read_text().split())
    assert env["HVDLITE_ELASTIC_DISCOVERY_SCRIPT"] == str(script.resolve())
    assert (env["HVDLITE_ELASTIC_MIN_NP"], env["HVDLITE_ELASTIC_MAX_NP"]) == ("1", "4")


def test_launch_gives_up_after_elastic_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    fake, record = _fake_mpirun(tmp_path)
    script = _script(tmp_path / "hosts.sh", "echo node1:1\n")
    monkeypatch.setenv("HVDLITE_MPIRUN", str(fake))
    start = time.monotonic()
    rc = cli.main(["-np", "2", "--min-np", "1", "--host-discovery-script", str(script),
                      "--elastic-timeout", "1", "python", "t.py"])
    assert rc == 2
    assert time.monotonic() - start < 15
    err = capsys.readouterr().err
    assert "hvdlite-run: error:" in err and "--elastic-timeout 1 s" in err
    assert not record.exists()  # mpirun never ran
    # A script failing on its first run stops the launch at once.
    broken = _script(tmp_path / "broken.sh", "exit 5\n")
    rc = cli.main(["-np", "1", "--min-np", "1", "--host-discovery-script", str(broken),
                      "python", "t.py"])
    assert rc == 2 and "exited with status 5" in capsys.readouterr().err
    assert not record.exists()


# ----------------------------------------------------------------- integration

KILL_WORKER = """
import os, sys, time
import numpy as np
import hvdlite as hvd

hvd.init()
stamp = sys.argv[1]
for step in range(3000):
    total = hvd.allreduce(np.full(16, float(hvd.rank() + 1)), op=hvd.Sum)
    expected = hvd.size() * (hvd.size() + 1) / 2
    if not np.allclose(total, expected):
        print("wrong sum", step, total[0], expected, flush=True)
        sys.exit(7)
    if step == 5 and hvd.rank() == 0:
        print("sums ok", flush=True)
    if step == 10 and hvd.rank() == 1:
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), 9)
    time.sleep(0.01)
print("finished", hvd.rank(), flush=True)
"""


@pytest.mark.timeout(150)
def test_sigkill_of_one_rank_ends_the_job(tmp_path: Path) -> None:
    """Without elastic options, a rank killed by SIGKILL mid-job ends the whole job,
    with a non-zero status, within 10 s of the kill (no survivor left waiting in a
    collective)."""
    worker = tmp_path / "worker.py"
    worker.write_text(KILL_WORKER)
    stamp = tmp_path / "killed-at"
    proc = run_job(3, worker, str(stamp), timeout=120)
    ended = time.time()
    assert stamp.exists(), f"rank 1 never reached the kill:\n{proc.stdout}\n{proc.stderr}"
    killed = float(stamp.read_text())
    assert proc.returncode != 0, (proc.stdout, proc.stderr)
    assert "sums ok" in proc.stdout, proc.stdout
    assert "finished" not in proc.stdout and "wrong sum" not in proc.stdout, proc.stdout
    assert ended - killed < 10, f"job ended {ended - killed:.1f} s after the kill"
