"""Host discovery and elastic settings, shared by ``hvdlite-run`` and the workers.

Elastic mode (``hvdlite-run --min-np/--max-np/--host-discovery-script``, with
horovodrun's meaning) needs two things that both sides of a job agree on:

* the output format of a host discovery script, Horovod's: one host per line,
  ``host:slots``, or ``host`` alone when ``--slots-per-host`` (``--slots``) gives
  the slots of every host (:func:`parse_discovery_output`,
  :func:`run_discovery_script`);
* the elastic settings, which the launcher hands to every worker through
  environment variables (:class:`ElasticSettings`, :meth:`~ElasticSettings.to_environ`,
  :meth:`~ElasticSettings.from_environ`).

The variables (hvdlite's own; ``HOROVOD_ELASTIC=1`` is set beside
``HVDLITE_ELASTIC=1`` for code that asks Horovod's name):

==================================== ===============================================
``HVDLITE_ELASTIC``                  ``1`` in an elastic job
``HVDLITE_ELASTIC_MIN_NP``           fewest workers the job continues with
``HVDLITE_ELASTIC_MAX_NP``           most workers the job grows to
``HVDLITE_ELASTIC_DISCOVERY_SCRIPT`` absolute path of the discovery script (if any)
``HVDLITE_ELASTIC_SLOTS``            slots of a discovered host printed without any
``HVDLITE_ELASTIC_TIMEOUT``          seconds to wait for enough slots (default 600)
``HVDLITE_ELASTIC_RESET_LIMIT``      most rescalings before the job fails (if any)
``HVDLITE_ELASTIC_COOLDOWN``         ``min,max`` seconds a failed host stays excluded
``HVDLITE_ELASTIC_HOSTS``            ``h1:2,h2:2``: the fixed hosts, when no script
==================================== ===============================================

Unset optional variables mean "not given".  This module is pure Python: it
imports nothing from hvdlite's compiled core, so workers and the launcher can
both import it.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
import socket
import subprocess
from collections.abc import Mapping

__all__ = [
    "DEFAULT_ELASTIC_TIMEOUT_S",
    "DEFAULT_FAILURE_TIMEOUT_S",
    "DiscoveryError",
    "ElasticSettings",
    "format_hosts",
    "parse_discovery_output",
    "parse_host_slots",
    "run_discovery_script",
]

#: horovodrun's default for ``--elastic-timeout``, in seconds.
DEFAULT_ELASTIC_TIMEOUT_S: float = 600.0
#: Seconds of silence after which an elastic job's worker counts as failed
#: (``hvdlite-run --failure-timeout``).
DEFAULT_FAILURE_TIMEOUT_S: float = 10.0

ENV_ELASTIC = "HVDLITE_ELASTIC"
ENV_HOROVOD_ELASTIC = "HOROVOD_ELASTIC"
ENV_MIN_NP = "HVDLITE_ELASTIC_MIN_NP"
ENV_MAX_NP = "HVDLITE_ELASTIC_MAX_NP"
ENV_DISCOVERY_SCRIPT = "HVDLITE_ELASTIC_DISCOVERY_SCRIPT"
ENV_SLOTS = "HVDLITE_ELASTIC_SLOTS"
ENV_TIMEOUT = "HVDLITE_ELASTIC_TIMEOUT"
ENV_RESET_LIMIT = "HVDLITE_ELASTIC_RESET_LIMIT"
ENV_COOLDOWN = "HVDLITE_ELASTIC_COOLDOWN"
ENV_HOSTS = "HVDLITE_ELASTIC_HOSTS"
#: The hosts and slots mpirun was given (``--host``): the only places where workers can
#: be added later (Open MPI cannot reliably add a host to a running job), and whether
#: the launch oversubscribes them (this machine alone).
ENV_ALLOCATION = "HVDLITE_ELASTIC_ALLOCATION"
ENV_OVERSUBSCRIBED = "HVDLITE_ELASTIC_OVERSUBSCRIBED"
#: Where the last world's rank 0 writes ``finished`` when training ends well (the
#: launcher's exit status then is 0, whatever workers were lost on the way).
ENV_STATUS_FILE = "HVDLITE_ELASTIC_STATUS_FILE"
#: ``--failure-timeout``: read by the launcher, and passed on to the workers.
ENV_FAILURE_TIMEOUT = "HVDLITE_FAILURE_TIMEOUT"
#: Set when hvdlite-run reads the ranks' output itself and acts on the requests rank 0
#: writes there (lines starting with :data:`LAUNCHER_REQUEST`): ending a lost worker's
#: process that may still run.
ENV_LAUNCHER_REQUESTS = "HVDLITE_LAUNCHER_REQUESTS"
LAUNCHER_REQUEST = "[hvdlite-run request] "
#: Names the launch whose workers keep their last commit in a file on every host
#: (:mod:`hvdlite.common.kept_commits`); set with :data:`ENV_LAUNCHER_REQUESTS`.
ENV_KEEP = "HVDLITE_ELASTIC_KEEP"
#: Set when hvdlite-run starts an elastic job again, from the commit kept on the hosts:
#: ``joined=H1,H2`` (hosts joined the discovery output) or ``lost=H1`` (mpirun ended
#: the job when it lost those hosts' daemons).
ENV_RESUME = "HVDLITE_ELASTIC_RESUME"
#: Every variable :meth:`ElasticSettings.to_environ` may set.
ENV_NAMES: tuple[str, ...] = (
    ENV_ELASTIC, ENV_HOROVOD_ELASTIC, ENV_MIN_NP, ENV_MAX_NP, ENV_DISCOVERY_SCRIPT,
    ENV_SLOTS, ENV_TIMEOUT, ENV_RESET_LIMIT, ENV_COOLDOWN, ENV_HOSTS, ENV_ALLOCATION,
    ENV_OVERSUBSCRIBED, ENV_STATUS_FILE, ENV_LAUNCHER_REQUESTS, ENV_KEEP, ENV_RESUME,
)


class DiscoveryError(RuntimeError):
    """A host discovery script that could not be run, failed, timed out or printed
    something that is not a host list."""


# --------------------------------------------------------------------------- parsing


def _slots_number(text: str, where: str) -> int:
    try:
        slots = int(text.strip())
    except ValueError:
        raise ValueError(f"{where}: slots must be a positive integer, got {text.strip()!r}") from None
    if slots < 1:
        raise ValueError(f"{where}: slots must be a positive integer, got {slots}")
    return slots


def _parse_entries(entries: list[tuple[str, str]],
                   default_slots: int | None) -> list[tuple[str, int]]:
    """``[(where, text), ...]`` -> ``[(host, slots), ...]``; ``where`` names an entry
    in error messages."""
    hosts: list[tuple[str, int]] = []
    seen: dict[str, str] = {}
    for where, text in entries:
        host, sep, slots_text = text.rpartition(":")
        if not sep:
            host = text
            if default_slots is None:
                raise ValueError(f"{where}: no slots given; print 'host:slots' or pass "
                                 "--slots-per-host")
            slots = default_slots
        else:
            host = host.strip()
            slots = _slots_number(slots_text, where)
        if not host:
            raise ValueError(f"{where}: no host name")
        if any(c.isspace() for c in host) or "," in host:
            raise ValueError(f"{where}: a host name cannot contain spaces or commas")
        if host in seen:
            raise ValueError(f"{where}: host {host!r} is listed twice (first in {seen[host]})")
        seen[host] = where
        hosts.append((host, slots))
    return hosts


def parse_discovery_output(text: str, default_slots: int | None) -> list[tuple[str, int]]:
    """Parse a discovery script's output into ``[(host, slots), ...]`` in its order.

    One host per line, ``host:slots`` or ``host`` alone (which then gets
    ``default_slots``, ``--slots-per-host``); blank lines and spaces around a line
    or either field are ignored.  Raises ``ValueError`` naming the line for a host
    without slots when ``default_slots`` is ``None``, a slot count that is not a
    positive integer, an empty host name, or a host listed twice.  An output that
    lists no host gives ``[]`` (no host available right now).
    """
    entries = [(f"line {lineno} ({raw.strip()!r})", raw.strip())
               for lineno, raw in enumerate(text.splitlines(), 1) if raw.strip()]
    return _parse_entries(entries, default_slots)


def parse_host_slots(spec: str) -> list[tuple[str, int]]:
    """Parse ``h1:2,h2:2`` (the format of ``HVDLITE_ELASTIC_HOSTS``); every entry
    needs its slots; an empty string is no host.  Raises ``ValueError`` naming the
    bad entry."""
    if not spec.strip():
        return []
    entries = [(f"entry {e.strip()!r}", e.strip()) for e in spec.split(",")]
    for where, text in entries:
        if not text:
            raise ValueError(f"empty entry in {spec!r}")
        if ":" not in text:
            raise ValueError(f"{where}: no slots given (expected host:slots)")
    return _parse_entries(entries, None)


@functools.lru_cache(maxsize=1)
def _local_names() -> frozenset[str]:
    name = socket.gethostname()
    return frozenset({"localhost", "127.0.0.1", name, name.split(".")[0]})


def _short(name: str) -> str:
    """A host name without its domain; an IP address as it is."""
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        return name.split(".")[0]


def same_host(a: str, b: str) -> bool:
    """Whether two names are one host: equal, equal but for the domain (a discovery
    script may print ``node1.cluster`` where the host calls itself ``node1``), or both
    this machine."""
    local = _local_names()
    return a == b or _short(a) == _short(b) or (a in local and b in local)


def format_hosts(hosts: list[tuple[str, int]] | tuple[tuple[str, int], ...]) -> str:
    """``[("h1", 2), ("h2", 2)]`` -> ``"h1:2,h2:2"``."""
    return ",".join(f"{host}:{slots}" for host, slots in hosts)


# --------------------------------------------------------------------------- running


def _tail(text: str, limit: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def run_discovery_script(path: str, default_slots: int | None,
                         timeout: float = 30.0) -> list[tuple[str, int]]:
    """Run the host discovery script at ``path`` and parse what it prints.

    An executable file is run directly; a file without execute permission is run
    with ``/bin/sh`` (hvdlite's leniency: horovodrun requires the permission).
    Raises :class:`DiscoveryError` when the file does not exist, cannot be started,
    exits with a non-zero status (the message has the status and the end of its
    stderr), does not finish within ``timeout`` seconds, or prints a malformed
    host list.
    """
    if not os.path.exists(path):
        raise DiscoveryError(f"host discovery script {path!r} does not exist")
    if not os.path.isfile(path):
        raise DiscoveryError(f"host discovery script {path!r} is not a file")
    argv = [path] if os.access(path, os.X_OK) else ["/bin/sh", path]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"host discovery script {path!r} did not finish within "
                             f"{timeout:g} s") from None
    except OSError as exc:
        raise DiscoveryError(f"host discovery script {path!r} could not be run: {exc}") from None
    if proc.returncode != 0:
        how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exited with status {proc.returncode}")
        stderr = _tail(proc.stderr)
        raise DiscoveryError(f"host discovery script {path!r} {how}"
                             + (f"; its stderr ends with:\n{stderr}" if stderr else
                                " and wrote nothing to stderr"))
    try:
        return parse_discovery_output(proc.stdout, default_slots)
    except ValueError as exc:
        raise DiscoveryError(f"host discovery script {path!r} printed a bad host list: "
                             f"{exc}") from None


# --------------------------------------------------------------------------- settings


def _number_text(value: float) -> str:
    """600.0 -> "600", 0.5 -> "0.5"."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def in_elastic_job(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process belongs to an elastic job: ``HVDLITE_ELASTIC=1``, or without
    it Horovod's ``HOROVOD_ELASTIC=1``."""
    env = os.environ if env is None else env
    switch = env.get(ENV_ELASTIC)
    if switch is None:
        switch = env.get(ENV_HOROVOD_ELASTIC)
    return switch is not None and switch.strip() == "1"


@dataclasses.dataclass
class ElasticSettings:
    """An elastic job's settings, as ``hvdlite-run`` resolved them from its flags.

    ``min_np``/``max_np``: the fewest and most workers (``--min-np``/``--max-np``);
    ``discovery_script``: absolute path of ``--host-discovery-script`` or ``None``;
    ``default_slots``: ``--slots-per-host``; ``timeout_s``: ``--elastic-timeout``;
    ``reset_limit``: ``--reset-limit`` (``None``: unlimited); ``cooldown_range``:
    ``--blacklist-cooldown-range`` (``None``: a failed host stays excluded);
    ``hosts``: the fixed ``[(host, slots), ...]`` when there is no script.
    """

    min_np: int
    max_np: int
    discovery_script: str | None = None
    default_slots: int | None = None
    timeout_s: float = DEFAULT_ELASTIC_TIMEOUT_S
    reset_limit: int | None = None
    cooldown_range: tuple[float, float] | None = None
    hosts: list[tuple[str, int]] | None = None

    def to_environ(self) -> dict[str, str]:
        """The environment variables that carry these settings to the workers."""
        env = {
            ENV_ELASTIC: "1",
            ENV_HOROVOD_ELASTIC: "1",
            ENV_MIN_NP: str(self.min_np),
            ENV_MAX_NP: str(self.max_np),
            ENV_TIMEOUT: _number_text(self.timeout_s),
        }
        if self.discovery_script is not None:
            env[ENV_DISCOVERY_SCRIPT] = os.path.abspath(self.discovery_script)
        if self.default_slots is not None:
            env[ENV_SLOTS] = str(self.default_slots)
        if self.reset_limit is not None:
            env[ENV_RESET_LIMIT] = str(self.reset_limit)
        if self.cooldown_range is not None:
            low, high = self.cooldown_range
            env[ENV_COOLDOWN] = f"{_number_text(low)},{_number_text(high)}"
        if self.hosts is not None:
            env[ENV_HOSTS] = format_hosts(self.hosts)
        return env

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> ElasticSettings | None:
        """Read the settings back from ``env`` (default ``os.environ``).

        Returns ``None`` outside an elastic job: when ``HVDLITE_ELASTIC`` is set to
        anything but ``1``, or, without it, when Horovod's ``HOROVOD_ELASTIC`` is
        not ``1``.  Raises ``ValueError`` naming the variable when one is missing
        or malformed.
        """
        env = os.environ if env is None else env
        if not in_elastic_job(env):
            return None

        def required(name: str) -> str:
            value = env.get(name)
            if value is None or not value.strip():
                raise ValueError(f"elastic job without {name} in the environment")
            return value.strip()

        def count(name: str, text: str, minimum: int) -> int:
            try:
                value = int(text)
            except ValueError:
                raise ValueError(f"{name}={text!r} is not an integer") from None
            if value < minimum:
                raise ValueError(f"{name}={text!r} must be >= {minimum}")
            return value

        def seconds(name: str, text: str) -> float:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{name}={text!r} is not a number") from None
            if not 0 <= value < float("inf"):
                raise ValueError(f"{name}={text!r} must be a finite number >= 0")
            return value

        min_np = count(ENV_MIN_NP, required(ENV_MIN_NP), 1)
        max_np = count(ENV_MAX_NP, required(ENV_MAX_NP), 1)
        if max_np < min_np:
            raise ValueError(f"{ENV_MAX_NP}={max_np} is below {ENV_MIN_NP}={min_np}")
        script = env.get(ENV_DISCOVERY_SCRIPT) or None
        slots_text = env.get(ENV_SLOTS)
        slots = count(ENV_SLOTS, slots_text.strip(), 1) if slots_text else None
        timeout_text = env.get(ENV_TIMEOUT)
        timeout = (seconds(ENV_TIMEOUT, timeout_text.strip()) if timeout_text
                   else DEFAULT_ELASTIC_TIMEOUT_S)
        limit_text = env.get(ENV_RESET_LIMIT)
        reset_limit = count(ENV_RESET_LIMIT, limit_text.strip(), 0) if limit_text else None
        cooldown: tuple[float, float] | None = None
        cooldown_text = env.get(ENV_COOLDOWN)
        if cooldown_text:
            parts = cooldown_text.split(",")
            if len(parts) != 2:
                raise ValueError(f"{ENV_COOLDOWN}={cooldown_text!r} must be 'min,max'")
            low, high = (seconds(ENV_COOLDOWN, p.strip()) for p in parts)
            if low > high:
                raise ValueError(f"{ENV_COOLDOWN}={cooldown_text!r}: min is above max")
            cooldown = (low, high)
        hosts_text = env.get(ENV_HOSTS)
        hosts: list[tuple[str, int]] | None = None
        if hosts_text is not None:
            try:
                hosts = parse_host_slots(hosts_text)
            except ValueError as exc:
                raise ValueError(f"{ENV_HOSTS}={hosts_text!r}: {exc}") from None
        return cls(min_np=min_np, max_np=max_np, discovery_script=script,
                   default_slots=slots, timeout_s=timeout, reset_limit=reset_limit,
                   cooldown_range=cooldown, hosts=hosts)
