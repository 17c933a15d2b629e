"""Several hosts on this machine: network namespaces joined by a rate-limited bridge.

Each emulated host ``h1 .. hN`` is a network namespace with its own address on one
bridge, and runs its processes under its own hostname (a UTS namespace made per
command), so Open MPI sees N nodes: ranks on one host share memory, ranks on different
hosts talk TCP over the bridge. Every host's link is limited in both directions with
``tc ... tbf rate R`` (this kernel has no netem). Open MPI reaches the hosts through a
stand-in for ssh (``PRTE_MCA_plm_ssh_agent``): a script that skips ssh's options and
runs the command inside the host's namespace; :meth:`EmulatedHosts.env` gives the
variables that make ``hvdlite-run -H h1:2,h2:2`` (or ``mpirun``) use it.

Needs root (``ip netns``, ``tc``). :func:`unavailable` says why not, for tests to skip.

From a shell, to run one command on emulated hosts and tear them down afterwards::

    python -m tests.hosts.emulated --hosts 2 --rate 1gbit -- \\
        hvdlite-run -np 4 -H h1:2,h2:2 python train.py
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# The stand-in for ssh. Open MPI runs ``AGENT [ssh options] HOST COMMAND...``; COMMAND is
# one shell command line, possibly split over several arguments.
_AGENT = r"""#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -b|-c|-D|-E|-e|-F|-I|-i|-J|-L|-l|-m|-O|-o|-p|-Q|-R|-S|-W|-w) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"; shift
case "$host" in
@CASES@
  *) echo "emulated-hosts agent: unknown host '$host'" >&2; exit 255 ;;
esac
# As ssh to a host that is cut off: nothing runs there, and the connection fails once
# the link is back (or ssh's own timeout ends it first).
if [ -e "@CUTS@/$host" ]; then
  while [ -e "@CUTS@/$host" ]; do sleep 0.5; done
  echo "emulated-hosts agent: $host could not be reached" >&2; exit 255
fi
ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' "$host" "$*" <&0 &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM INT HUP
while kill -0 $child 2>/dev/null; do wait $child; rc=$?; done
wait $child 2>/dev/null; rc=${rc:-$?}
# As ssh over a network that is cut: the remote end's exit is not heard of here until
# the link is back (a host is cut off while the file @CUTS@/HOST exists).
while [ -e "@CUTS@/$host" ]; do sleep 0.5; done
exit $rc
"""


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def unavailable() -> str | None:
    """Why emulated hosts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces and tc)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"emulated hosts need the '{tool}' command"
    probe = f"hvdprobe{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _rate_bytes(rate: str) -> float:
    units = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "bit": 1 / 8}
    text = rate.strip().lower()
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    raise ValueError(f"rate {rate!r}: give it as e.g. 100mbit or 1gbit")


def _free_subnet() -> int:
    """A third octet N such that 10.77.N.0/24 is on no interface here."""
    used = _run("ip", "-o", "-4", "addr", "show").stdout
    for n in [os.getpid() % 200 + 20] + list(range(20, 250)):
        if f"10.77.{n}." not in used:
            return n
    raise RuntimeError("no free 10.77.N.0/24 subnet for emulated hosts")


def free_port() -> int:
    """A TCP port free on this machine now (for daemons that need one given)."""
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


class SetUpAndTearDown:
    """A context manager over ``up()`` and ``down()``: ``down()`` also runs when ``up()``
    fails halfway, so nothing it made is left behind. While it is entered (from the main
    thread, where SIGTERM still has its default action) SIGTERM exits through
    ``SystemExit``, so that ``kill PID`` of a benchmark also runs ``down()`` instead of
    leaving namespaces, links and a bridge behind."""

    _sigterm: object = None

    def up(self) -> None:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            self._sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            self.up()
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._leave()

    def _leave(self) -> None:
        try:
            self.down()
        finally:
            if self._sigterm is not None:
                signal.signal(signal.SIGTERM, self._sigterm)
                self._sigterm = None


class EmulatedHosts(SetUpAndTearDown):
    """``n`` hosts named ``h1 .. hn``, each linked to a shared bridge at ``rate`` (tc's
    units: ``1gbit``, ``100mbit``) in each direction. Use as a context manager; the
    hosts, their processes and the bridge are removed on exit."""

    def __init__(self, n: int, rate: str = "1gbit") -> None:
        if n < 1:
            raise ValueError("need at least one host")
        self.n = n
        self.rate = rate
        self.hosts = [f"h{i}" for i in range(1, n + 1)]
        self.tag = f"hvd{os.getpid() % 100000}"
        self.namespaces = {h: f"{self.tag}-{h}" for h in self.hosts}
        self.bridge = f"{self.tag}br"[:15]
        self.octet = 0
        self.subnet = ""
        self._dir: tempfile.TemporaryDirectory | None = None
        self.agent = ""
        self.cuts: Path | None = None  # a file per host that is cut off (see the agent)

    # -- set up and tear down
    def up(self) -> None:
        self.octet = _free_subnet()
        self.subnet = f"10.77.{self.octet}.0/24"
        rate_bytes = _rate_bytes(self.rate)
        burst = max(64 << 10, int(rate_bytes / 100))  # 10 ms at the link's rate
        tbf = ["tbf", "rate", self.rate, "burst", str(burst), "latency", "100ms"]
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        # A fixed address: a bridge without one takes the lowest of its ports', so taking
        # a host off it (a cut) could change it, and the other hosts, still sending to
        # the old one, would lose their way to this machine (and mpirun) for minutes.
        _run("ip", "link", "set", self.bridge, "address", f"02:77:{self.octet:02x}:00:00:fe")
        _run("ip", "addr", "add", f"10.77.{self.octet}.254/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i, host in enumerate(self.hosts, start=1):
            ns, outside = self.namespaces[host], f"{self.tag}v{i}"[:15]
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", outside, "master", self.bridge, "up")
            _run("ip", "-n", ns, "addr", "add", f"10.77.{self.octet}.{i}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("tc", "qdisc", "add", "dev", outside, "root", *tbf)  # towards the host
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *tbf)  # from it
        self._dir = tempfile.TemporaryDirectory(prefix="hvdlite_hosts_")
        cases = "\n".join(f"  {h}) ns={shlex.quote(ns)} ;;" for h, ns in self.namespaces.items())
        agent = Path(self._dir.name) / "ssh-agent.sh"
        self.cuts = Path(self._dir.name) / "cut"
        self.cuts.mkdir()
        agent.write_text(_AGENT.replace("@CASES@", cases).replace("@CUTS@", str(self.cuts)))
        agent.chmod(0o755)
        self.agent = str(agent)

    def down(self) -> None:
        for i, ns in enumerate(self.namespaces.values(), start=1):
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (OSError, ValueError):
                    pass
            # Deleting this end of the veth removes both ends at once. A namespace's own
            # removal frees its devices later, in the background, and the next hosts
            # made by this process (same names) could find them still there.
            _run("ip", "link", "del", f"{self.tag}v{i}"[:15], check=False)
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    # -- using them
    def env(self) -> dict[str, str]:
        """Variables that make Open MPI (and so ``hvdlite-run -H``) launch on these hosts
        and keep its traffic on their bridge."""
        return {"PRTE_MCA_plm_ssh_agent": self.agent,
                "PRTE_MCA_prte_if_include": self.subnet,
                "OMPI_MCA_btl_tcp_if_include": self.subnet,
                "OMPI_MCA_oob_tcp_if_include": self.subnet}

    def host_spec(self, slots: int | list[int]) -> str:
        """``-H`` for ``slots`` ranks on every host (or ``slots[i]`` on host i)."""
        per = slots if isinstance(slots, list) else [slots] * self.n
        return ",".join(f"{h}:{s}" for h, s in zip(self.hosts, per) if s > 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--rate", default="1gbit", help="each host's link, both ways (tc units)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give a command after --")
    reason = unavailable()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    with EmulatedHosts(args.hosts, args.rate) as hosts:
        env = dict(os.environ, **hosts.env())
        print(f"emulated hosts {', '.join(hosts.hosts)} on {hosts.subnet}, links {args.rate}",
              file=sys.stderr, flush=True)
        return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
