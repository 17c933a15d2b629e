"""Pieces the training benchmarks share."""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def load_synthetic_models() -> Any:
    """``examples/pytorch/pytorch_synthetic_benchmark.py`` as a module: its ``MODELS`` and
    ``synthetic_batch``."""
    import importlib.util
    path = REPO / "examples" / "pytorch" / "pytorch_synthetic_benchmark.py"
    spec = importlib.util.spec_from_file_location("hvdlite_torch_synthetic", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_job_for_result(cmd: list[str], env: dict[str, str], tag: str) -> Any:
    """Run a benchmark job and return the JSON its rank 0 printed after ``tag`` (a line
    ``TAG {...}``); on failure print the job's output tail and return None."""
    import json
    import subprocess
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(tag + " ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        return None
    return json.loads(lines[0].split(" ", 1)[1])


def launcher(n: int) -> list[str]:
    """The command prefix that starts ``n`` ranks: hvdlite's own launcher, which finds
    mpirun and sets the flags this machine needs (root, oversubscription, binding)."""
    return [sys.executable, "-m", "hvdlite.runner", "-np", str(n)]


# ------------------------------------------------------------------ emulated hosts

def add_hosts_options(p: argparse.ArgumentParser) -> None:
    """``--hosts N`` and ``--rate R``: spread the ranks of the distributed
    configurations over N hosts emulated on this machine (``tests/hosts/emulated.py``)."""
    p.add_argument("--hosts", type=int, default=0,
                   help="spread the ranks over this many emulated hosts (network namespaces on a "
                        "rate-limited bridge; needs root); default: all ranks on this host")
    p.add_argument("--rate", default="1gbit", help="with --hosts: each host's link, both ways (tc units)")


def hosts_layout(ranks: int, hosts: int) -> list[int]:
    """Ranks per host for ``ranks`` over ``hosts`` emulated hosts, filled in host order;
    raises ValueError with what to change when they do not divide evenly (the hosts must
    run as many ranks each: hvdlite's two-level collectives need it, and the comparison
    with a peer that places ranks by itself would be unfair otherwise)."""
    if hosts < 1:
        raise ValueError(f"--hosts {hosts}: give at least 1 host")
    if ranks < hosts:
        raise ValueError(f"--ranks {ranks} over --hosts {hosts}: every host needs at least one rank; "
                         f"give --ranks >= {hosts}")
    if ranks % hosts:
        raise ValueError(f"--ranks {ranks} cannot be spread evenly over --hosts {hosts}: give a "
                         f"multiple of {hosts} (e.g. --ranks {hosts * max(1, ranks // hosts)})")
    return [ranks // hosts] * hosts


def start_hosts(n: int, rate: str) -> Any:
    """An ``EmulatedHosts`` context manager for ``n`` hosts, or exit with the reason they
    cannot be made here."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from tests.hosts.emulated import EmulatedHosts, unavailable
    reason = unavailable()
    if reason:
        sys.exit(f"--hosts: {reason}")
    return EmulatedHosts(n, rate)


@contextlib.contextmanager
def emulated_hosts_for(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """``(hosts, layout)`` for ``--ranks`` over ``--hosts`` emulated hosts at ``--rate``,
    torn down on exit; a layout that does not divide is the parser's usage error."""
    try:
        layout = hosts_layout(args.ranks, args.hosts)
    except ValueError as e:
        parser.error(str(e))
    with start_hosts(args.hosts, args.rate) as hosts:
        yield hosts, layout


def host_of_rank(rank: int, layout: list[int]) -> int:
    """Index (0-based) of the host that runs ``rank`` when each host is filled in turn."""
    total = 0
    for i, k in enumerate(layout):
        total += k
        if rank < total:
            return i
    raise ValueError(f"rank {rank} beyond layout {layout}")


def host_address(hosts: Any, i: int) -> str:
    """Host ``i``'s (0-based) address on the emulated hosts' bridge."""
    return f"10.77.{hosts.octet}.{i + 1}"


# Inside the host's network namespace, under its own hostname (as the emulation's
# stand-in for ssh runs Open MPI's daemons), then the command itself.
_ON_HOST = 'hostname "$0" && exec "$@"'


def on_host(hosts: Any, i: int) -> list[str]:
    """The prefix that runs a command on host ``i`` (0-based) of ``hosts``: in its network
    namespace, where its only way out is its rate-limited link ``eth0``."""
    name = hosts.hosts[i]
    return ["ip", "netns", "exec", hosts.namespaces[name], "unshare", "--uts", "/bin/sh", "-c",
            _ON_HOST, name]
