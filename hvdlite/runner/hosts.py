"""Where a job's ranks go: ``-H`` and hostfile parsing, the hosts a Slurm allocation
gives, and in elastic mode the settings and the wait for a discovery script's slots.

Elastic mode (horovodrun's ``--min-np``, ``--max-np`` or ``--host-discovery-script``)
hands its settings to every worker as ``HVDLITE_ELASTIC_*`` variables
(:mod:`hvdlite.common.discovery`). With a discovery script, the launcher first waits up
to ``--elastic-timeout`` seconds for ``-np`` slots to appear (:func:`wait_for_slots`).
Rebuilding the job when workers fail or join is the workers' business, not the
launcher's.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence

from hvdlite.common import discovery
from hvdlite.runner import slurm
from hvdlite.runner.config import LaunchConfig
from hvdlite.runner.mpirun import LaunchError

__all__ = [
    "elastic_settings",
    "given_hosts",
    "is_local_host",
    "parse_hostfile",
    "parse_hosts",
    "wait_for_slots",
]

_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "localhost.localdomain"}




def parse_hosts(spec: str) -> list[tuple[str, int | None]]:
    """Parse ``-H host1:slots,host2:slots`` into ``[(host, slots or None), ...]``.

    Raises ``ValueError`` with a message naming the bad entry.
    """
    result: list[tuple[str, int | None]] = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry:
            raise ValueError(f"empty host entry in {spec!r}")
        host, sep, slots_text = entry.rpartition(":")
        if not sep:
            host, slots = entry, None
        else:
            if not host:
                raise ValueError(f"host entry {entry!r} has no host name")
            try:
                slots = int(slots_text)
            except ValueError:
                raise ValueError(
                    f"host entry {entry!r}: slots must be a positive integer"
                ) from None
            if slots < 1:
                raise ValueError(f"host entry {entry!r}: slots must be a positive integer")
        result.append((host, slots))
    return result


def parse_hostfile(path: str) -> list[tuple[str, int | None]]:
    """Read a hostfile (Horovod/Open MPI style: one ``host slots=N`` per line).

    ``#`` starts a comment. The file goes to ``mpirun --hostfile`` as it is, so it is
    held to Open MPI's syntax: a ``host:N`` line, which Open MPI would read as a host
    named ``host:N``, is refused with the line to write instead. Returns
    ``[(host, slots or None), ...]``; raises ``ValueError`` on a malformed line
    and ``OSError`` if the file cannot be read.
    """
    result: list[tuple[str, int | None]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            host = fields[0]
            slots: int | None = None
            name, colon, count = host.rpartition(":")
            if colon and name and ":" not in name and "[" not in name:
                hint = f"{name} slots={count}" if count.isdigit() else f"{name} slots=N"
                raise ValueError(f"{path}:{lineno}: {host!r}: a hostfile gives a host's slots as "
                                 f"'{hint}' (host:N is the form of -H)")
            for field in fields[1:]:
                key, _, value = field.partition("=")
                if key == "slots":
                    try:
                        slots = int(value)
                    except ValueError:
                        raise ValueError(
                            f"{path}:{lineno}: bad slots value {value!r}"
                        ) from None
                    if slots < 1:
                        raise ValueError(f"{path}:{lineno}: slots must be positive")
            result.append((host, slots))
    if not result:
        raise ValueError(f"hostfile {path} lists no hosts")
    return result


def is_local_host(host: str) -> bool:
    """True when ``host`` names this machine (without a DNS lookup)."""
    if host in _LOCAL_NAMES or host.startswith("127."):
        return True
    name = socket.gethostname()
    return host in (name, name.split(".", 1)[0])





def elastic_settings(
    config: LaunchConfig,
    environ: Mapping[str, str] | None = None,
    host_list: Sequence[tuple[str, int | None]] | None = None,
) -> discovery.ElasticSettings:
    """Resolve ``config``'s elastic options the way horovodrun does.  Pure.

    ``--min-np`` defaults to ``-np``, ``--max-np`` to ``-np`` (horovodrun's
    documented defaults), and ``min_np <= -np <= max_np`` must hold;
    ``--elastic-timeout`` defaults to ``$HOROVOD_ELASTIC_TIMEOUT`` (or
    ``$HOROVOD_ELASTIC_START_TIMEOUT``, the elastic guide's name), else 600 s.
    Without a discovery script the hosts are fixed: ``host_list`` when given,
    else ``-H``/``--hostfile`` (a host without slots counts ``--slots-per-host``
    slots, else 1, as ``mpirun --host`` counts it), else the Slurm allocation's
    nodes, else ``localhost`` with ``max_np`` slots.  With a script,
    ``hosts`` is ``None``: the hosts are what the script prints.

    Raises :class:`LaunchError` for inconsistent numbers.
    """
    env = os.environ if environ is None else environ
    if not config.elastic:
        raise LaunchError("elastic_settings() needs --min-np, --max-np or "
                          "--host-discovery-script")
    np_ = config.num_proc
    min_np = np_ if config.min_np is None else config.min_np
    max_np = np_ if config.max_np is None else config.max_np
    if min_np < 1:
        raise LaunchError(f"--min-np must be a positive integer, got {min_np}")
    if min_np > np_:
        raise LaunchError(f"--min-np {min_np} is above -np {np_}: -np is the number of "
                          "workers to start with, at least --min-np")
    if max_np < np_:
        raise LaunchError(f"--max-np {max_np} is below -np {np_}: -np is the number of "
                          "workers to start with, at most --max-np")
    if config.cooldown_range is not None:
        low, high = config.cooldown_range
        if not 0 <= low <= high:
            raise LaunchError(f"--blacklist-cooldown-range {low:g} {high:g}: need "
                              "0 <= MIN <= MAX seconds")
    if config.reset_limit is not None and config.reset_limit < 0:
        raise LaunchError(f"--reset-limit must be >= 0, got {config.reset_limit}")
    if config.slots_per_host is not None and config.slots_per_host < 1:
        raise LaunchError(f"--slots-per-host must be a positive integer, "
                          f"got {config.slots_per_host}")
    if config.host_discovery_script is not None and (config.hosts or config.hostfile):
        raise LaunchError("give either --host-discovery-script or -H/--hostfile, not both")

    timeout = config.elastic_timeout
    if timeout is None:
        # horovodrun's name, then the one Horovod's elastic guide uses for the same wait.
        name = next((n for n in ("HOROVOD_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_START_TIMEOUT")
                     if env.get(n, "").strip()), "HOROVOD_ELASTIC_TIMEOUT")
        timeout = env_seconds(env, name)
        if timeout is None:
            timeout = discovery.DEFAULT_ELASTIC_TIMEOUT_S
    if not 0 <= timeout < float("inf"):
        raise LaunchError(f"--elastic-timeout must be a finite number >= 0, got {timeout}")

    hosts: list[tuple[str, int]] | None = None
    if config.host_discovery_script is None:
        if host_list is None:
            host_list, _ = given_hosts(config, env)
        if host_list:
            default = config.slots_per_host or 1
            hosts = [(h, default if s is None else s) for h, s in host_list]
        else:
            hosts = [("localhost", max_np)]
    return discovery.ElasticSettings(
        min_np=min_np,
        max_np=max_np,
        discovery_script=(None if config.host_discovery_script is None
                          else os.path.abspath(config.host_discovery_script)),
        default_slots=config.slots_per_host,
        timeout_s=float(timeout),
        reset_limit=config.reset_limit,
        cooldown_range=(None if config.cooldown_range is None
                        else (float(config.cooldown_range[0]), float(config.cooldown_range[1]))),
        hosts=hosts,
    )


def wait_for_slots(
    settings: discovery.ElasticSettings,
    needed: int,
    *,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
) -> list[tuple[str, int]]:
    """Run the discovery script until its hosts offer ``needed`` slots; return them.

    horovodrun's rule: the job starts once ``-np`` slots are available, waiting
    up to ``--elastic-timeout`` (``settings.timeout_s``) for them.  The script is
    run once, then every ``poll_s`` seconds.  A failure of the first run is final
    (a broken script should not cost the whole timeout); later failures are
    retried.  Raises :class:`LaunchError` when the first run fails or the timeout
    passes, with the slots last seen and the last failure.  ``log`` receives one
    line when the wait starts.
    """
    script = settings.discovery_script
    if script is None:
        raise LaunchError("wait_for_slots() needs a host discovery script")
    deadline = clock() + settings.timeout_s

    def run_once() -> list[tuple[str, int]]:
        budget = min(30.0, max(1.0, deadline - clock()))
        return discovery.run_discovery_script(script, settings.default_slots, timeout=budget)

    try:
        hosts = run_once()
    except discovery.DiscoveryError as exc:
        raise LaunchError(str(exc)) from None
    last_error: str | None = None
    announced = False
    while sum(s for _, s in hosts) < needed:
        offered = sum(s for _, s in hosts)
        now = clock()
        if now >= deadline:
            seen = discovery.format_hosts(hosts) or "no hosts"
            why = f"\nThe last run failed: {last_error}" if last_error else ""
            raise LaunchError(
                f"-np {needed} needs {needed} slots, but the host discovery script offered "
                f"only {offered} ({seen}) within --elastic-timeout {settings.timeout_s:g} s; "
                f"lower -np or raise --elastic-timeout{why}")
        if log is not None and not announced:
            log(f"waiting up to {settings.timeout_s:g} s (--elastic-timeout) for {needed} "
                f"slots; the host discovery script offers {offered}")
            announced = True
        sleep(max(0.0, min(poll_s, deadline - now)))
        try:
            hosts = run_once()
            last_error = None
        except discovery.DiscoveryError as exc:
            last_error = str(exc)
    return hosts


def env_seconds(env: Mapping[str, str], name: str) -> float | None:
    """The number of seconds variable ``name`` gives, or None when it is unset or
    blank; :class:`LaunchError` when it is not a number."""
    text = env.get(name, "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise LaunchError(f"{name}={text!r} is not a number of seconds") from None


def given_hosts(config: LaunchConfig, env: Mapping[str, str]) -> tuple[list[tuple[str, int | None]], bool]:
    """The hosts of ``-H``, ``--hostfile`` or, without either, the Slurm allocation
    (empty outside one), and whether they came from Slurm."""
    if config.hosts:
        return parse_hosts(config.hosts), False
    if config.hostfile:
        return parse_hostfile(config.hostfile), False
    try:
        slurm_hosts = list(slurm.allocation_hosts(env) or [])
    except ValueError as exc:
        raise LaunchError(f"Slurm allocation: {exc}; or give -H/--hostfile") from None
    return slurm_hosts, bool(slurm_hosts)
