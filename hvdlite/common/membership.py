"""The Python half of membership: what elastic training does between two worlds.

The core detects a dead peer and stops (``hvdlite/csrc/world/membership.h``); this module
decides, on every rank alike, what the next world is and builds it. Every function
here that is collective is called by :mod:`hvdlite.common.elastic` at the same point
on every rank.

* **A worker dies.** :func:`reset` after a failure: the survivors agree on a world of
  themselves (``MPI_Comm_shrink``) and start a new engine on it, in the same processes;
  the lost workers' hosts go on the blacklist (for ``--blacklist-cooldown-range``, or
  for good).
* **Workers join.** The rank 0 of the moment runs the launcher's discovery script once
  a second in a thread. At each ``commit()`` the ranks agree (one fault-tolerant
  agreement, ``MPI_Comm_agree``, which also proves that no rank failed since the world
  was made) on how many workers can be added: free slots on hosts of the launch, up to
  ``--max-np``. If any, every rank raises ``HostsUpdatedInterrupt``, and :func:`reset`
  starts them (``MPI_Comm_spawn``) and merges them into the world; they run the same
  script, and ``hvd.elastic.run`` gives them the state.
* **Workers leave.** At the same agreement rank 0 also says whether the discovery
  script stopped listing the slots of some workers (their host left its output, or
  offers fewer slots). If so, :func:`reset` stops them as Horovod does: every rank
  takes part in splitting them off (``MPI_Comm_split``), their processes exit with
  status 0, and the others go on from that commit in a world of themselves.
* **Too few workers.** Below ``--min-np`` the survivors wait for the discovery script
  to offer slots for up to ``--elastic-timeout``; past it, or past ``--reset-limit``
  resets, the job ends on every rank with :class:`ElasticJobError`.
* **A new host.** Open MPI cannot add a host that was not in the launch to a running
  job, so new workers start this way only on hosts the launcher gave mpirun (its
  discovery script's output at launch, or ``-H``). When the script offers a new host,
  the job starts again instead: at a commit rank 0 asks ``hvdlite-run`` (in its output)
  to start the job again on the hosts on offer, every worker leaves, and the new
  workers go on from that commit (:func:`resume`).
* **A host whose processes all die.** Open MPI's ``mpirun`` ends the whole job when it
  loses a host's daemon; ``hvdlite-run`` then starts the job again on the other hosts,
  which go on from the last commit in the same way.

  Both need the last commit outside the old job's processes: at every commit the first
  rank on each host keeps it in a file there (:mod:`hvdlite.common.kept_commits`).
  This needs a state that can be saved to a file (``State.snapshot``) and the
  launcher's live output; without them a new host is reported once and not used, and
  a lost daemon ends the job.

Without fault tolerance (a job not started by ``hvdlite-run``'s elastic options or
``mpirun --with-ft ulfm``) no failure is survivable: the launcher ends the job.
"""
from __future__ import annotations

import atexit
import collections
import functools
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

# basics first: its exit handler (MPI_Finalize) is then registered before this
# module's, and so runs after it (atexit runs handlers last-in, first-out).
from hvdlite.common import basics, naming
from hvdlite.common.discovery import same_host as _same_host
from hvdlite.common.exceptions import ElasticJobError, HvdliteError  # noqa: F401 - raised here, and named as membership.ElasticJobError

# A value no rank 0 sends (a count of new workers is far smaller): the agreement's AND
# with it leaves rank 0's value.
_ALL_ONES = 0x7FFFFFFF
_DISCOVERY_PERIOD_S = 1.0  # as Horovod's driver


@functools.lru_cache(maxsize=1)
def settings() -> Any:
    """The launcher's elastic settings, or None when the job was not started elastic
    (read once: the environment a process was started with does not change)."""
    from hvdlite.common.discovery import ElasticSettings
    return ElasticSettings.from_environ(os.environ)


def _core() -> Any:
    return basics._load_core()


def peer_failed() -> bool:
    """The engine stopped because a peer process died (or another rank saw one die):
    a new world of the survivors can be built."""
    c = _core()
    return bool(c.has_world() and c.peer_failed())


def joined() -> bool:
    """This process was started into a running job to add a worker."""
    return bool(_core().joined())


# ------------------------------------------------------------------ who is where


class _World:
    """What this module keeps about the current world and the job's history."""

    def __init__(self) -> None:
        self.hosts: list[str] | None = None  # the host of every rank, by rank
        # The Open MPI job (PMIx namespace) every rank was started in, by rank: the
        # launch's, or that of the workers added with it; None where not known yet.
        self.jobs: list[str | None] | None = None
        # Every rank's process, by rank: (pid, start time), None where not known.
        self.procs: list[tuple[int, str] | None] | None = None
        # Workers that died or were stopped, per host: their slots stay taken in Open
        # MPI's allocation; each death lengthens the host's blacklist cooldown.
        self.dead: collections.Counter[str] = collections.Counter()
        self.blacklist: dict[str, float] = {}  # host -> until (monotonic; inf: for good)
        self.ignored: set[str] = set()  # new hosts outside the launch, reported once
        self.join_pending = False  # this process joined; its first sync is still to come
        # Workers lost since the last report, per rebuild: (their ranks, the world's size),
        # and workers added since then.
        self.losses: list[tuple[list[int], int]] = []
        self.added = 0
        # Workers stopped since the last report because their host left the discovery
        # output: (their ranks, the world's size, their hosts).
        self.dismissed: list[tuple[list[int], int, list[str]]] = []
        # A process started in this process's own Open MPI job died: MPI_Finalize could
        # wait for it for ever (see leave_without_finalize).
        self.peer_lost = False
        # Starting the job again on more hosts: whether the state can be carried over
        # (State.snapshot), whether the last commit's agreement asked for it, whether
        # this process is leaving for it, and (new rank 0) the hosts that joined, until
        # reported.
        self.relaunchable = False
        self.relaunch_agreed = False
        self.relaunching = False
        self.resume_checked = False
        self.resumed: tuple[str, list[str]] | None = None
        self.resets = 0  # the times the world changed, kept with each commit


_world = _World()


def world_hosts(hosts: list[str], jobs: list[str] | None = None,
                procs: list[tuple[int, str] | None] | None = None) -> None:
    """Record every rank's host, Open MPI job and process (gathered by the elastic
    loop's collective)."""
    _world.hosts = list(hosts)
    _world.jobs = None if jobs is None else list(jobs)
    _world.procs = None if procs is None else list(procs)


def process_id() -> tuple[int, str] | None:
    """This process on its host: its pid and its start time (``/proc/PID/stat``'s
    22nd field), which tells it from a later process given the same pid."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            return os.getpid(), f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def hostname() -> str:
    return socket.gethostname()


def job_name() -> str:
    """The Open MPI job this process was started in (its PMIx namespace): the launch's,
    or the one that added it to a running job."""
    return os.environ.get("PMIX_NAMESPACE", "")


# ------------------------------------------------------------------ a process that was stopped


def watch_for_suspension() -> None:
    """In an elastic job started by ``hvdlite-run`` (which sets the failure timeout):
    end this worker as soon as it finds it was stopped for too long (the core's
    ``StartSuspensionWatch``). ULFM's detector counts a worker failed once its last
    heartbeat is the timeout old, and heartbeats go every quarter of it: a worker
    stopped for 3/4 of the timeout may already be counted failed, so the watch ends
    it past 70 %."""
    from hvdlite.common.discovery import ENV_FAILURE_TIMEOUT
    if settings() is None:
        return
    text = os.environ.get(ENV_FAILURE_TIMEOUT, "")
    try:
        timeout = float(text)
    except ValueError:
        return
    if timeout > 0:
        _core().start_suspension_watch(0.7 * timeout, text)


# ------------------------------------------------------------------ a rank that misses its collectives

_stall_watch: threading.Thread | None = None
_STALL_WATCH_PERIOD_S = 0.5


def watch_for_stalls() -> None:
    """In an elastic job whose launcher ends processes on request: a thread that, while
    this process is rank 0, asks ``hvdlite-run`` to end the workers that the core found
    missing their collectives past the stall shutdown time (a deadlock in the training
    script, with hvdlite's own thread still answering, so no failure detector sees it).
    Their deaths then reach the others as failures, and the others go on. Rank 0 may
    ask for its own end: the new rank 0 takes over."""
    global _stall_watch
    if settings() is None or not _launcher_takes_requests() or _stall_watch is not None:
        return
    _stall_watch = threading.Thread(target=_watch_stalls, name="hvdlite-stall-watch", daemon=True)
    _stall_watch.start()


def _watch_stalls() -> None:
    asked: set[tuple[int, str]] = set()
    while True:
        time.sleep(_STALL_WATCH_PERIOD_S)
        try:
            ranks = _core().stalled_ranks()
        except Exception:  # noqa: BLE001 - the interpreter is going away
            return
        procs = _world.procs or []
        new = [r for r in ranks if r < len(procs) and procs[r] is not None and procs[r] not in asked]
        if new:
            asked.update(procs[r] for r in new)
            try:
                _request_eviction(new)
            except Exception:  # noqa: BLE001 - the world is being rebuilt: the next look
                asked.difference_update(procs[r] for r in new)


# ------------------------------------------------------------------ discovery


class _Discovery:
    """The launcher's discovery script, run once a second in a thread (rank 0 only)."""

    def __init__(self, script: str, default_slots: int | None) -> None:
        self.script, self.default_slots = script, default_slots
        self.latest: list[tuple[str, int]] | None = None
        self.error: str | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="hvdlite-discovery", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from hvdlite.common.discovery import DiscoveryError, run_discovery_script
        while True:
            try:
                hosts = run_discovery_script(self.script, self.default_slots)
                with self._lock:
                    self.latest, self.error = hosts, None
            except DiscoveryError as exc:
                with self._lock:
                    self.error = str(exc)
            time.sleep(_DISCOVERY_PERIOD_S)

    def hosts(self) -> list[tuple[str, int]] | None:
        with self._lock:
            return None if self.latest is None else list(self.latest)


_discovery: _Discovery | None = None


def _discovered(s: Any) -> list[tuple[str, int]] | None:
    """The hosts offered now: the script's latest output (started on first use), or the
    fixed hosts of a job without a script."""
    global _discovery
    if not s.discovery_script:
        return list(s.hosts or [])
    if _discovery is None:
        _discovery = _Discovery(s.discovery_script, s.default_slots)
    return _discovery.hosts()


def _allocation() -> dict[str, int]:
    from hvdlite.common.discovery import ENV_ALLOCATION, parse_host_slots
    text = os.environ.get(ENV_ALLOCATION, "")
    return dict(parse_host_slots(text)) if text else {}


def plan_new_workers(s: Any, size: int) -> list[str]:
    """Rank 0: the hosts of the workers to add now (one entry per worker), from the
    discovery script's offer, the launch's allocation, the workers there now, the
    slots dead workers still hold, the blacklist and ``--max-np``."""
    offered = _discovered(s)
    if not offered or _world.hosts is None or size >= s.max_np:
        return []
    allocation = _allocation()
    from hvdlite.common.discovery import ENV_OVERSUBSCRIBED
    oversubscribed = os.environ.get(ENV_OVERSUBSCRIBED) == "1"
    now = time.monotonic()
    plan: list[str] = []
    for host, slots in offered:
        if any(until > now and _same_host(h, host) for h, until in _world.blacklist.items()):
            continue
        launch = next((h for h in allocation if _same_host(h, host)), None)
        if launch is None:
            if host not in _world.ignored and not _can_relaunch():
                _world.ignored.add(host)
                sys.stderr.write(f"hvdlite: the discovery script offers host {host!r}, which was not among "
                                 "the hosts of the launch; Open MPI cannot add a host to a running job, and "
                                 f"starting the job again there needs {_relaunch_needs()}, so no worker "
                                 "starts there (list it when the job starts)\n")
            continue
        running = sum(1 for h in _world.hosts if _same_host(h, host))
        dead = sum(n for h, n in _world.dead.items() if _same_host(h, host))
        room = slots - running
        if not oversubscribed:  # a dead worker's slot is never given back
            room = min(room, allocation[launch] - running - dead)
        plan += [launch] * max(0, room)
    return plan[:max(0, s.max_np - size)]


def _can_relaunch() -> bool:
    from hvdlite.common import kept_commits
    return _world.relaunchable and _launcher_takes_requests() and kept_commits.key() is not None


def _relaunch_needs() -> str:
    if not _world.relaunchable:
        return "a state that can be saved to a file (hvd.elastic.ObjectState or TorchState)"
    return "hvdlite-run reading the ranks' output (not with HVDLITE_LIVE_OUTPUT=0 or --output-filename)"


def plan_relaunch(s: Any, size: int) -> list[tuple[str, int]] | None:
    """Rank 0: when the discovery script offers a host that was not in the launch (Open
    MPI cannot add a host to a running job), the hosts and slots to start the job
    again on: the script's offer, this rank's host first (where the last commit will
    wait in a file), blacklisted hosts left out, up to ``--max-np`` workers. None when
    no such host is offered, when that would not add workers, or where it cannot be
    done (see :func:`_relaunch_needs`)."""
    if not _can_relaunch() or _world.hosts is None:
        return None
    offered = _discovered(s)
    if not offered:
        return None
    allocation = _allocation()
    now = time.monotonic()
    usable = [(h, n) for h, n in offered
              if n > 0 and not any(until > now and _same_host(b, h) for b, until in _world.blacklist.items())]
    if all(any(_same_host(a, h) for a in allocation) or h in _world.ignored for h, _ in usable):
        return None
    home = next((e for e in usable if _same_host(e[0], _world.hosts[0])), None)
    if home is None:
        return None
    plan, total = [], 0
    for host, slots in [home] + [e for e in usable if e is not home]:
        take = min(slots, s.max_np - total)
        if take <= 0:
            break
        plan.append((host, take))
        total += take
    return plan if total > size else None


def plan_leaving(s: Any) -> list[int]:
    """Rank 0: the ranks to stop because their host left the discovery script's output
    (or lists fewer slots than it has workers now: the highest ranks there go), as
    Horovod stops them at the next commit. Empty without a discovery script, before its
    first answer, and where no worker would be left (an empty or wholly unfamiliar
    list is more likely a script's mistake than the end of every host)."""
    if not s.discovery_script or _world.hosts is None:
        return []
    offered = _discovered(s)
    if offered is None:
        return []
    room = [[host, slots] for host, slots in offered]
    leaving = []
    for r, h in enumerate(_world.hosts):
        entry = next((e for e in room if _same_host(h, e[0]) and e[1] > 0), None)
        if entry is None:
            leaving.append(r)
        else:
            entry[1] -= 1
    return leaving if len(leaving) < len(_world.hosts) else []


# ------------------------------------------------------------------ at a commit

# Rank 0's value in the agreement at a commit: the number of workers to add, and this
# bit when workers are to leave; or the other bit alone when the job is to start again on
# more hosts.
_LEAVING_BIT = 1 << 20
_RELAUNCH_BIT = 1 << 21


def check_for_new_workers() -> bool:
    """Collective, at every commit of an elastic job: whether the world changes now
    (workers to add, or workers to stop because their host left the discovery output;
    the same answer on every rank). The agreement fails on every survivor alike if a
    worker died since the world was made (HvdliteError, the engine stopped)."""
    s = settings()
    if s is None:
        return False
    value = _ALL_ONES
    if basics.rank() == 0:
        if plan_relaunch(s, basics.size()):
            value = _RELAUNCH_BIT
        else:
            value = min(len(plan_new_workers(s, basics.size())), _LEAVING_BIT - 1)
            if plan_leaving(s):
                value |= _LEAVING_BIT
    agreed = _core().agree(value)
    _world.relaunch_agreed = bool(agreed & _RELAUNCH_BIT)
    return agreed > 0


# ------------------------------------------------------------------ starting again on more hosts


def set_relaunchable(relaunchable: bool) -> None:
    """Whether the training function's state can be carried over a start on more hosts."""
    _world.relaunchable = relaunchable


def relaunch_agreed() -> bool:
    """The last commit's agreement asked for the job to start again on more hosts."""
    return _world.relaunch_agreed


def relaunch(state: Any) -> None:
    """Collective, after a commit whose agreement asked for it: every host's copy of that
    commit is written out (:mod:`hvdlite.common.kept_commits`), rank 0 asks
    ``hvdlite-run`` to start the job again on the hosts it plans (its own first), and
    every worker leaves (SystemExit, status 0, MPI finalized); the new workers go on
    from the commit (:func:`resume`). Returns, doing nothing, when the offer went away
    meanwhile or a host could not keep the commit (the new hosts are then not used)."""
    from hvdlite.common import kept_commits
    from hvdlite.common.discovery import format_hosts
    _world.relaunch_agreed = False
    s = settings()
    plan = _shared(lambda s: plan_relaunch(s, basics.size()), s, "hvdlite.elastic.relaunch")
    if not plan:
        return
    joined = [h for h, _ in plan if not any(_same_host(h, a) for a in _allocation())]
    errors = [kept_commits.flush()]
    if basics.size() > 1:
        from hvdlite.common.objects import allgather_object
        errors = allgather_object(errors[0], name="hvdlite.elastic.relaunch.kept")
    errors = [e for e in errors if e]
    if errors:
        _world.ignored.update(joined)  # not tried again
        if basics.rank() == 0:
            sys.stderr.write(f"hvdlite: {errors[0]}; going on without {', '.join(joined)}\n")
        return
    if basics.rank() == 0:
        n = sum(slots for _, slots in plan)
        sys.stderr.write(f"hvdlite: the discovery script offers {', '.join(joined)}; the job starts again "
                         f"on {n} workers from commit {getattr(state, '_commits', 0)}\n")
        sys.stderr.flush()
        _ask_launcher([f"relaunch hosts={format_hosts(plan)}"])
    _world.relaunching = True
    raise SystemExit(0)


def keep_commit(state: Any) -> None:
    """At every commit of an elastic job that ``hvdlite-run`` can start again: the first
    rank on each host hands the commit to the writer of its host's file
    (:mod:`hvdlite.common.kept_commits`); nothing on the other ranks."""
    from hvdlite.common import kept_commits
    host = _host_if_first()
    if host is None or settings() is None or not _can_relaunch():
        return
    now = time.monotonic()
    kept_commits.keep(host, state.snapshot(), getattr(state, "_commits", 0), _world.resets,
                      {h: until - now for h, until in _world.blacklist.items() if until > now})


def _host_if_first() -> str | None:
    """This rank's host if it is the lowest rank there (the one that keeps the host's
    commit), else None; None too before the world's hosts are known."""
    hosts = _world.hosts
    me = basics.rank() if basics.is_initialized() else -1
    if hosts is None or not 0 <= me < len(hosts) or hosts.index(hosts[me]) != me:
        return None
    return hosts[me]


def note_resets(resets: int) -> None:
    """The times the world changed so far (kept with each commit, for ``--reset-limit``)."""
    _world.resets = resets


def training_done() -> None:
    """The training function returned: this host's kept commit is no longer needed."""
    from hvdlite.common import kept_commits
    host = _host_if_first()
    if kept_commits.key() and host is not None:
        kept_commits.discard(host)


def resume(state: Any) -> int:
    """Collective, once per process, before the first sync of a job that ``hvdlite-run``
    started again (``joined=HOSTS``: hosts joined the discovery output; ``lost=HOSTS``:
    mpirun ended the job when it lost those hosts' daemons): the hosts compare the
    commits they kept, and the first rank on the host with the newest loads it into
    ``state``; the sync that follows makes it every rank's (that rank has the most
    commits, so it is the sync root). Lost hosts go on the blacklist, as a lost worker's
    do. Returns the times the world changed before, the same on every rank (0 in a job
    that did not start again). Every rank raises :class:`ElasticJobError` if the commit
    cannot be loaded, or if hosts joined and no host kept one."""
    from hvdlite.common import kept_commits
    from hvdlite.common.discovery import ENV_RESUME
    from hvdlite.common.objects import allgather_object, broadcast_object
    spec = os.environ.get(ENV_RESUME)
    if not spec or _world.resume_checked:
        return 0
    _world.resume_checked = True
    reason, _, named = spec.partition("=")
    named_hosts = [h for h in named.split(",") if h]
    me, rank = hostname(), basics.rank()
    everyone = allgather_object(me, name="hvdlite.elastic.resume.hosts") if basics.size() > 1 else [me]
    header, error = None, None
    if everyone.index(me) == rank:
        try:
            header = kept_commits.read_header(me)
        except Exception as exc:  # noqa: BLE001 - a torn file: the other hosts' may do
            error = f"cannot read the commit kept on {me}: {exc}"
    gathered = (allgather_object((header, error), name="hvdlite.elastic.resume.kept")
                if basics.size() > 1 else [(header, error)])
    held = [r for r, (h, _) in enumerate(gathered) if h is not None]
    problems = [e for _, e in gathered if e]
    if rank == 0 and problems and held:
        sys.stderr.write(f"hvdlite: {'; '.join(problems)} (another host's is used)\n")
    if not held:
        if reason == "joined" or problems:
            raise ElasticJobError("elastic training cannot start again from its last commit: "
                                  + ("; ".join(problems) or "no host kept it"))
        if rank == 0:
            sys.stderr.write("hvdlite: no host left kept a commit: training starts from the beginning\n")
        resets = 0
    else:
        best = max(held, key=lambda r: (gathered[r][0]["commits"], -r))
        chosen = gathered[best][0]
        error = None
        if rank == best:
            try:
                state.load_snapshot(kept_commits.read_state(me))
                state._commits = chosen["commits"]
            except Exception as exc:  # noqa: BLE001 - said on every rank
                error = f"cannot load the commit kept in {kept_commits.path(me)} on {me}: {exc}"
        if basics.size() > 1:
            error = broadcast_object(error, root_rank=best, name="hvdlite.elastic.resume")
        if error:
            raise ElasticJobError(f"elastic training cannot start again from its last commit: {error}")
        resets = int(chosen["resets"])
        now = time.monotonic()
        for h, _ in gathered:
            for host, left in (h or {}).get("blacklist", {}).items():
                _world.blacklist[host] = max(_world.blacklist.get(host, 0.0), now + left)
    if reason == "lost":
        resets += 1  # this start is a change of the world too
        for host in named_hosts:
            _blacklist(host)
    _world.resumed = (reason, named_hosts)
    return resets


def take_resumed() -> tuple[str, list[str]] | None:
    """Once: why the job started again (``joined`` or ``lost``) and the hosts concerned."""
    resumed, _world.resumed = _world.resumed, None
    return resumed


# ------------------------------------------------------------------ between two worlds


def reset(after_failure: bool) -> bool:
    """Collective over the live processes: the next world. After a failure, a world of
    the survivors (ranks renumbered in their old order, a fresh engine); then the
    workers whose slots the discovery output no longer lists stop; then workers are
    added where slots are free, waiting for them under ``--min-np``. Returns whether
    workers were stopped (the survivors then go back to the last commit)."""
    if after_failure:
        c = _core()
        try:
            before = int(c.size())
        except Exception:  # noqa: BLE001 - the size of the stopped world, for the report only
            before = 0
        c.rebuild()
        lost = list(c.lost_ranks())
        if lost:
            _world.losses.append((lost, before))
            _world.peer_lost = _world.peer_lost or _own_job_lost(lost)
            _check_majority(lost, before)
            _request_eviction(lost)
        _note_lost(lost)
    naming.reset_auto_names()  # every rank's unnamed requests count from 0 again
    basics.world_changed()  # the core dropped the process sets: members renumbered or gone
    s = settings()
    if s is None:
        return False
    leaving = _shared(plan_leaving, s, "hvdlite.elastic.leaving")
    _dismiss(leaving)
    deadline = time.monotonic() + float(s.timeout_s)
    while True:
        plan = _shared_plan(s)
        if plan and basics.size() + len(plan) >= s.min_np:
            try:
                _grow(plan)
                return bool(leaving)
            except HvdliteError as exc:
                if peer_failed():
                    raise  # a worker died meanwhile: the caller starts over
                # Could not start them (on every rank alike): go on without, and leave
                # those hosts alone for a minute.
                if basics.rank() == 0:
                    sys.stderr.write(f"hvdlite: no new workers on {sorted(set(plan))}: {exc}\n")
                for host in plan:
                    _world.blacklist[host] = time.monotonic() + 60.0
        if basics.size() >= s.min_np:
            return bool(leaving)
        if time.monotonic() >= deadline:
            raise ElasticJobError(
                f"elastic training stops: {basics.size()} worker(s) left, fewer than --min-np {s.min_np}, "
                f"and no slots for more came within --elastic-timeout {s.timeout_s:g} s")
        time.sleep(_DISCOVERY_PERIOD_S)


def _check_majority(lost: list[int], before: int) -> None:
    """No second job after a network partition (split brain).

    A host cut off from the network looks to each side as if the other side's processes
    had failed, and both would go on as a job of their own, training apart and both
    writing checkpoints. When the workers lost include every worker of some host (a
    host died, or is cut off: nobody can tell which), the survivors go on only as the
    majority of the world they lost them from, or as exactly half of it with its rank
    0; every other group stops here with :class:`ElasticJobError`, on every one of its
    ranks alike, and ends the Open MPI daemon of its host, which the launcher has
    lost too. Workers lost on hosts where others survive died: their host is reachable,
    and the survivors go on whatever their number."""
    hosts = _world.hosts
    if hosts is None or before < 2:
        return
    gone = set(lost)
    surviving_hosts = {h for r, h in enumerate(hosts[:before]) if r not in gone}
    whole = sorted({hosts[r] for r in lost if r < len(hosts)} - surviving_hosts)
    if not whole:
        return
    left = before - len(gone)
    if 2 * left > before or (2 * left == before and 0 not in gone):
        return
    message = (f"elastic training stops on this side of a network partition: {len(gone)} of the {before} "
               f"workers were lost, all those of host(s) {', '.join(whole)}, and the {left} left here are "
               f"not a majority of the job{' (rank 0 is on the other side)' if 2 * left == before else ''}; "
               "the other side, if it is the majority, goes on, and this side stops so that the job does not "
               "go on twice")
    sys.stderr.write(f"hvdlite: {message}\n")
    sys.stderr.flush()
    _end_host_daemon()
    raise ElasticJobError(message)


def _end_host_daemon() -> None:
    """Stop this host's Open MPI daemon (this process's parent, ``prted``), which mpirun
    can no longer reach: it ends the job's processes here and itself, so that nothing
    of the job stays behind on a host that was cut off."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/comm") as f:
            name = f.read().strip()
    except OSError:
        return
    if name == "prted":
        try:
            os.kill(parent, signal.SIGTERM)
        except OSError:
            pass


def _own_job_lost(lost: list[int]) -> bool:
    """Whether a rank of ``lost`` was started in this process's own Open MPI job (all
    were, unless workers were added to the job). Ranks not known count as not."""
    jobs = _world.jobs
    if jobs is None:
        return True
    mine = job_name()
    return any(r < len(jobs) and jobs[r] == mine for r in lost)


def _request_eviction(lost: list[int]) -> None:
    """Rank 0: ask ``hvdlite-run`` to end the processes of the workers ``lost``: after a
    shrink (old numbering), in case they still run, as a stopped process (SIGSTOP, a
    swap storm) that resumed would run its own failure detector, count the others
    failed, and tell them so; or workers that miss their collectives (the stall
    watch). One line per worker on stdout, which the launcher reads and keeps from the
    screen; a process that is gone, or whose pid now belongs to another process, is
    left alone (``hvdlite.runner.evict``)."""
    if not _launcher_takes_requests() or basics.rank() != 0:
        return
    hosts, procs = _world.hosts or [], _world.procs or []
    _ask_launcher([f"evict rank={r} host={hosts[r]} pid={procs[r][0]} start={procs[r][1]}"
                   for r in lost if r < len(hosts) and r < len(procs) and procs[r] is not None])


def _launcher_takes_requests() -> bool:
    """Whether ``hvdlite-run`` reads the ranks' output and acts on rank 0's requests."""
    from hvdlite.common.discovery import ENV_LAUNCHER_REQUESTS
    return os.environ.get(ENV_LAUNCHER_REQUESTS) == "1"


def _ask_launcher(requests: list[str]) -> None:
    """Rank 0: ``requests`` to ``hvdlite-run``, a line each on stdout, which the launcher
    reads from any host and keeps from the screen (``hvdlite.runner.evict.Requests``)."""
    from hvdlite.common.discovery import LAUNCHER_REQUEST
    sys.stdout.write("".join(f"{LAUNCHER_REQUEST}{r}\n" for r in requests))
    sys.stdout.flush()


def _note_lost(lost: list[int]) -> None:
    """The hosts of the ranks a shrink left out: blacklisted, their slots held."""
    if _world.hosts is None:
        return
    for r in lost:
        if r < len(_world.hosts):
            _blacklist(_world.hosts[r])
    _forget(lost)


def _blacklist(host: str) -> None:
    """A worker on ``host`` was lost: its slot stays taken, and the host is left out of
    new workers as Horovod's ``--blacklist-cooldown-range`` says: MIN seconds after its
    first failure, MIN more for each further one, at most MAX; without it, for good."""
    _world.dead[host] += 1
    cooldown = getattr(settings(), "cooldown_range", None)
    if cooldown:
        low, high = cooldown
        stay = min(high, low * _world.dead[host])
    else:
        stay = float("inf")
    _world.blacklist[host] = time.monotonic() + stay


def _forget(ranks: list[int]) -> None:
    """Drop what is kept about the workers ``ranks`` (old numbering) that left."""
    gone = set(ranks)
    if _world.hosts is not None:
        _world.hosts = [h for r, h in enumerate(_world.hosts) if r not in gone]
    if _world.jobs is not None:
        _world.jobs = [j for r, j in enumerate(_world.jobs) if r not in gone]
    if _world.procs is not None:
        _world.procs = [p for r, p in enumerate(_world.procs) if r not in gone]


def _shared(plan: Any, s: Any, name: str) -> list[Any]:
    """Rank 0's ``plan(s)``, given to every rank."""
    from hvdlite.common.objects import broadcast_object
    mine = plan(s) if basics.rank() == 0 else None
    if basics.size() == 1:
        return mine or []
    return broadcast_object(mine, root_rank=0, name=name)


def _shared_plan(s: Any) -> list[str]:
    """Rank 0's plan of the workers to add, given to every rank."""
    return _shared(lambda s: plan_new_workers(s, basics.size()), s, "hvdlite.elastic.plan")


def _dismiss(leaving: list[int]) -> None:
    """Collective: the ranks in ``leaving`` stop (their process exits here, status 0),
    and the others go on in a world of themselves."""
    if not leaving:
        return
    me, hosts = basics.rank(), _world.hosts or []
    where = sorted({hosts[r] for r in leaving if r < len(hosts)})
    if not _core().dismiss(leaving):
        sys.stderr.write(f"hvdlite: rank {me} on {hostname()} stops: the discovery output no longer lists "
                         "its slot; the job goes on without it\n")
        sys.stderr.flush()
        # Not MPI_Finalize: its fence would wait for the workers that go on.
        os._exit(0)
    naming.reset_auto_names()
    basics.world_changed()
    _world.dismissed.append((list(leaving), len(hosts), where))
    _world.peer_lost = _world.peer_lost or _own_job_lost(leaving)
    for r in leaving:  # their slots stay taken in Open MPI's allocation, as a dead worker's do
        if r < len(hosts):
            _world.dead[hosts[r]] += 1
    _forget(leaving)


def _grow(hosts: list[str]) -> None:
    from hvdlite.common.discovery import ENV_OVERSUBSCRIBED
    argv = list(getattr(sys, "orig_argv", [sys.executable] + sys.argv))
    _core().grow(sys.executable, argv[1:], hosts, os.getcwd(),
                 os.environ.get(ENV_OVERSUBSCRIBED) == "1")
    naming.reset_auto_names()
    basics.world_changed()
    if _world.hosts is not None:
        _world.hosts += hosts
    if _world.jobs is not None:
        _world.jobs += [None] * len(hosts)  # known at the sync that follows
    if _world.procs is not None:
        _world.procs += [None] * len(hosts)
    _world.added += len(hosts)


def take_changes() -> tuple[list[tuple[list[int], int]], list[tuple[list[int], int, list[str]]], int]:
    """What changed since the last call: the workers lost (their ranks and the size of
    the world they were lost from, one entry per rebuild), those stopped because their
    host left the discovery output (ranks, world size, hosts), and the number added."""
    losses, dismissed, added = _world.losses, _world.dismissed, _world.added
    _world.losses, _world.dismissed, _world.added = [], [], 0
    return losses, dismissed, added


@atexit.register
def leave_without_finalize() -> None:
    """At exit, once a process started in this process's own Open MPI job has died:
    stop the engine but leave MPI unfinalized, as the other survivors of that job do.

    Open MPI's MPI_Finalize ends with a fence over every process the job started, the
    dead one included, and was seen to wait for it for ever now and then (the engine
    then gives up after 10 s). Nothing is left for MPI_Finalize to do here: the engine's
    own shutdown has every rank done with its communication, and the fault-tolerant
    runtime lets a job that already lost a process end without it (mpirun's exit status
    is the ranks' own). Workers added later, in a job of their own that lost no one,
    finalize as usual: without it the runtime would call their exit abnormal. Runs
    after :func:`note_finished` (registered after this)."""
    if not _world.peer_lost:
        return
    c = basics._core_module
    if c is None or c.forked_reason():
        return
    atexit.unregister(basics._finalize_at_exit)
    c.shutdown()


@atexit.register
def note_finished() -> None:
    """At a normal exit: the rank 0 of a working world (or of the world it shut down
    itself) tells the launcher that the elastic job finished (its exit status then is
    0, whatever workers were lost)."""
    from hvdlite.common.discovery import ENV_STATUS_FILE
    path = os.environ.get(ENV_STATUS_FILE)
    if not path or _world.relaunching:
        return
    if getattr(sys, "last_value", None) is not None:
        return  # leaving on an exception nothing caught (ElasticJobError, say): not finished
    c = basics._core_module
    if c is None:
        return
    rank = c.rank() if c.is_initialized() else basics.rank_when_shut_down()
    if rank != 0:
        return
    if _launcher_takes_requests():
        try:  # reaches hvdlite-run from any host, in the output it reads
            _ask_launcher(["finished"])
        except (OSError, ValueError):
            pass
    try:
        with open(path, "w") as f:
            f.write("finished\n")
    except OSError:
        pass  # another host's file system: the line above, or mpirun's status, stands
