"""``RayExecutor``: Horovod's Ray API on hvdlite, with MPI as the transport.

How it runs (the reasons are in the Ray guide): the executor places one actor per
worker (:mod:`hvdlite.ray.strategy`), orders them by host, and starts an ``mpirun``
job whose rank ``r`` pairs with actor ``r`` (:mod:`hvdlite.runner.paired`). Functions
sent to the actors run in their ranks, which keep their state between calls; a rank
whose actor dies ends at once, and ``mpirun`` ends the job.
"""
from __future__ import annotations

import dataclasses
import secrets
import sys
import time
from collections import OrderedDict
from typing import Any, Callable

import cloudpickle

from hvdlite.ray.strategy import ColocatedStrategy, PGStrategy
from hvdlite.runner import paired
from hvdlite.runner.paired import PairedJob

#: Settings of Horovod's Gloo controller, which hvdlite does not have.
_GLOO_SETTINGS = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("hvdlite.ray needs Ray: pip install 'hvdlite[ray]'") from exc
    return ray


@dataclasses.dataclass
class MiniSettings:
    """What :meth:`RayExecutor.create_settings` returns (Horovod's fields).

    ``timeout_s``: how long the ranks may take to start and pair with their actors;
    ``placement_group_timeout_s``: how long Ray may take to reserve the workers'
    resources. ``nics`` become Open MPI's TCP interfaces. ``ssh_port`` and
    ``ssh_identity_file`` are kept for Horovod's scripts; nothing here uses ssh."""

    nics: set[str] | None = None
    verbose: int = 1
    key: str | None = None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    timeout_s: int = 300
    placement_group_timeout_s: int = 100
    elastic: bool = False

    @property
    def start_timeout(self) -> float:
        return float(self.timeout_s)


class Coordinator:
    """Groups registered workers by node and gives each its local and cross rank and
    size (the ``HOROVOD_LOCAL_*`` and ``HOROVOD_CROSS_*`` values), as Horovod's
    coordinator does. hvdlite's launch sets the same values on its ranks."""

    def __init__(self, settings: MiniSettings) -> None:
        self.settings = settings
        self.node_id_by_rank: dict[int, str] = {}
        self.hostnames_by_rank: dict[int, str] = {}
        self._ranks_by_node: OrderedDict[str, list[int]] = OrderedDict()

    @property
    def world_size(self) -> int:
        return len(self.node_id_by_rank)

    @property
    def hostnames(self) -> set[str]:
        return set(self.hostnames_by_rank.values())

    @property
    def node_id_string(self) -> str:
        return ",".join(f"{node}:{len(ranks)}" for node, ranks in self._ranks_by_node.items())

    def register(self, hostname: str, node_id: str, world_rank: int) -> None:
        self.hostnames_by_rank[world_rank] = hostname
        self.node_id_by_rank[world_rank] = node_id
        self._ranks_by_node.setdefault(node_id, []).append(world_rank)

    def finalize_registration(self) -> dict[int, dict[str, int]]:
        info: dict[int, dict[str, int]] = {}
        nodes = list(self._ranks_by_node.values())
        for ranks in nodes:
            for local_rank, rank in enumerate(sorted(ranks)):
                # Cross rank: this node's place among the nodes that have this local rank.
                peers = [n for n in nodes if len(n) > local_rank]
                info[rank] = {"HOROVOD_LOCAL_RANK": local_rank, "HOROVOD_LOCAL_SIZE": len(ranks),
                              "HOROVOD_CROSS_RANK": peers.index(ranks),
                              "HOROVOD_CROSS_SIZE": len(peers)}
        return info

    def establish_rendezvous(self) -> dict[str, str]:
        raise NotImplementedError(
            "Coordinator.establish_rendezvous: this is Horovod's Gloo rendezvous; hvdlite runs "
            "on MPI, whose launcher connects the ranks")


def _pickled(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
    return cloudpickle.dumps((fn, args, kwargs))


def _refuse_gloo(env: dict[str, Any] | None, where: str) -> None:
    for name, value in (env or {}).items():
        if _GLOO_SETTINGS.get(name) == str(value).lower():
            raise ValueError(f"{where}: {name}={value} asks for Horovod's Gloo controller; "
                             f"hvdlite runs on MPI only (leave {name} unset)")


class RayExecutor:
    """Run hvdlite workers on a Ray cluster, with Horovod's API.

    One Ray actor per worker holds one MPI rank of an ``mpirun`` job: functions given to
    :meth:`run`, :meth:`execute` and :meth:`run_remote` run in the ranks, which keep
    their state between calls (``hvd.init()`` happens once, a model stays loaded).

    Args:
        settings: from :meth:`create_settings`.
        num_workers: the number of workers, packed onto as few nodes as Ray can
            (``PACK``); or give ``num_hosts`` and ``num_workers_per_host`` instead.
        num_hosts: the number of nodes, one placement bundle each (``STRICT_SPREAD``).
        num_workers_per_host: workers on each of the ``num_hosts`` nodes.
        cpus_per_worker: CPUs each actor reserves.
        use_gpu: whether each actor reserves GPUs; every worker of a node then sees all
            the GPUs of that node's workers in ``CUDA_VISIBLE_DEVICES`` (pin one with
            ``hvd.local_rank()``).
        gpus_per_worker: GPUs each actor reserves (default 1 with ``use_gpu``).
        use_current_placement_group: when the caller runs inside a placement group
            (a Ray Tune trial, say), place the workers there.
        min_workers: elastic training: the fewest workers (see the Ray guide); the
            workers then come from Ray's live nodes, and only :meth:`run` is available.
        max_workers: elastic training: the most workers (default: no limit).
        reset_limit: elastic training: how many times the job may reset.
        cooldown_range: elastic training: how long a failed host stays excluded
            (``(low, high)`` seconds).
        elastic_timeout: elastic training: how long to wait for ``min_workers`` slots.
        override_discovery: accepted; the hosts always come from Ray.
    """

    def __init__(self, settings: MiniSettings, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, use_current_placement_group: bool = True,
                 min_workers: int | None = None, max_workers: int | None = None,
                 reset_limit: int | None = None, cooldown_range: tuple[int, int] | None = None,
                 elastic_timeout: int = 600, override_discovery: bool = True) -> None:
        if max_workers is not None and (min_workers is None or min_workers <= 0):
            raise ValueError("`max_workers` provided without any positive `min_workers`. "
                             "Elastic workloads require a positive `min_workers`")
        if min_workers is not None and num_workers is not None:
            raise ValueError("Both `min_workers` and `num_workers` provided. "
                             "Only one of the two for elastic workloads should be provided.")
        if gpus_per_worker is not None and not use_gpu:
            raise ValueError("gpus_per_worker is set, but use_gpu is False. use_gpu must be "
                             "True if gpus_per_worker is set.")
        if use_gpu and gpus_per_worker is not None and gpus_per_worker < 1:
            raise ValueError(f"gpus_per_worker must be >= 1: Got {gpus_per_worker}.")
        if num_workers is None and num_hosts is None and min_workers is None:
            raise ValueError("RayExecutor: give num_workers, or num_hosts and num_workers_per_host")
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"RayExecutor: num_workers must be at least 1, got {num_workers}")
        if num_hosts is not None and (num_hosts < 1 or num_workers_per_host < 1):
            raise ValueError(f"RayExecutor: num_hosts and num_workers_per_host must be at least 1, "
                             f"got {num_hosts} and {num_workers_per_host}")
        self.settings = settings
        self.num_workers = num_workers
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = use_gpu
        self.gpus_per_worker = gpus_per_worker
        self.use_current_placement_group = use_current_placement_group
        self.strategy: Any = None
        self.workers: list[Any] = []
        self.coordinator: Coordinator | None = None
        self._job: PairedJob | None = None
        self._broken: str | None = None
        self._elastic: Any = None
        if min_workers is not None:
            from hvdlite.ray.elastic import ElasticRayExecutor
            self._elastic = ElasticRayExecutor(
                ElasticRayExecutor.create_settings(
                    min_num_proc=min_workers, max_num_proc=max_workers, reset_limit=reset_limit,
                    elastic_timeout=elastic_timeout, timeout_s=settings.timeout_s,
                    nics=settings.nics),
                use_gpu=use_gpu, cpus_per_slot=cpus_per_worker, gpus_per_slot=gpus_per_worker,
                override_discovery=override_discovery)
            self._elastic.settings.cooldown_range = cooldown_range

    @property
    def adapter(self) -> "RayExecutor":
        """Horovod keeps the placement in an adapter object (``executor.adapter.strategy``);
        in hvdlite the executor holds it itself, and this is the executor."""
        return self

    @classmethod
    def create_settings(cls, timeout_s: int = 30, ssh_identity_file: str | None = None,
                        ssh_str: str | None = None, placement_group_timeout_s: int = 100,
                        nics: set[str] | None = None) -> MiniSettings:
        """Settings for :class:`RayExecutor` (Horovod's arguments). ``timeout_s``: how long
        the ranks may take to start; ``placement_group_timeout_s``: how long Ray may take
        to find the resources; ``nics``: the network interfaces MPI uses. ``ssh_str`` and
        ``ssh_identity_file`` are accepted and unused: no ssh is involved."""
        del ssh_str
        return MiniSettings(nics=set(nics) if nics else None, ssh_identity_file=ssh_identity_file,
                            timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s)

    # Start and stop.
    def start(self, executable_cls: type | None = None, executable_args: list | None = None,
              executable_kwargs: dict | None = None,
              extra_env_vars: dict[str, Any] | None = None) -> None:
        """Place the workers, start the ranks and pair them with the workers, then create
        ``executable_cls(*executable_args, **executable_kwargs)`` in every rank (the
        object :meth:`execute` passes to its function).

        Raises ``TimeoutError`` when Ray cannot place the workers within
        ``placement_group_timeout_s``, or the ranks do not start within ``timeout_s``;
        nothing is left running then."""
        ray = _import_ray()
        _refuse_gloo(extra_env_vars, "RayExecutor.start(extra_env_vars=...)")
        if self._elastic is not None:
            if executable_cls is not None:
                raise NotImplementedError("RayExecutor.start(executable_cls=...) with min_workers: "
                                          "an elastic job's workers run one function, in run()")
            self._elastic.env_vars.update({str(k): str(v) for k, v in (extra_env_vars or {}).items()})
            self._elastic.start()
            return
        if ray.util.client.ray.is_connected():
            raise NotImplementedError(
                "RayExecutor under Ray Client (ray://): mpirun runs where the executor "
                "runs, which must be a node of the cluster; run the driver there (for "
                "example as a Ray job) instead")
        if self.workers:
            raise RuntimeError("RayExecutor.start: already started; call shutdown() first")
        try:
            self._start(ray, executable_cls, executable_args, executable_kwargs, extra_env_vars)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, ray: Any, executable_cls: type | None, executable_args: list | None,
               executable_kwargs: dict | None, extra_env_vars: dict[str, Any] | None) -> None:
        started = time.monotonic()
        current = ray.util.get_current_placement_group() if self.use_current_placement_group else None
        if self.num_hosts is not None and current is None:
            self.strategy = ColocatedStrategy(
                settings=self.settings, num_hosts=self.num_hosts,
                num_workers_per_host=self.num_workers_per_host, use_gpu=self.use_gpu,
                cpus_per_worker=self.cpus_per_worker, gpus_per_worker=self.gpus_per_worker)
        else:
            n = self.num_workers if self.num_workers is not None else self.num_hosts * self.num_workers_per_host
            self.strategy = PGStrategy(
                settings=self.settings, num_workers=n, use_gpu=self.use_gpu,
                cpus_per_worker=self.cpus_per_worker, gpus_per_worker=self.gpus_per_worker,
                placement_group=current)
        workers = self.strategy.create_workers()
        infos = self._get(ray, [w.describe.remote() for w in workers], "describe the workers",
                          self.settings.start_timeout)

        # Ranks are contiguous per host (mpirun's order): hosts in order of first
        # appearance, workers in their order within a host.
        by_host: OrderedDict[str, list[int]] = OrderedDict()
        for i, info in enumerate(infos):
            by_host.setdefault(info["hostname"], []).append(i)
        order = [i for indices in by_host.values() for i in indices]
        self.workers = [workers[i] for i in order]
        infos = [infos[i] for i in order]
        self.coordinator = Coordinator(self.settings)
        for rank, info in enumerate(infos):
            self.coordinator.register(info["hostname"], info["hostname"], rank)
        placement = self.coordinator.finalize_registration()
        env_updates = []
        for rank, info in enumerate(infos):
            values = {k: str(v) for k, v in placement[rank].items()}
            values.update(HOROVOD_RANK=str(rank), HOROVOD_SIZE=str(len(infos)),
                          HOROVOD_HOSTNAME=info["hostname"])
            if self.use_gpu:
                same = [x for x in infos if x["hostname"] == info["hostname"]]
                ids = sorted({g for x in same for g in x["gpu_ids"]}, key=str)
                values["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
            values.update({str(k): str(v) for k, v in (extra_env_vars or {}).items()})
            env_updates.append(self.workers[rank].update_env_vars.remote(values))
        self._get(ray, env_updates, "set the workers' environment", self.settings.start_timeout)

        hosts = [(h, len(ix)) for h, ix in by_host.items()]
        key = secrets.token_hex(32)
        addresses = self._get(ray, [w.open_link.remote(key) for w in self.workers],
                              "open the workers' links", self.settings.start_timeout)
        # Open MPI reaches each host through a command service in its first worker.
        leaders = {}
        for rank, info in enumerate(infos):
            leaders.setdefault(info["hostname"], self.workers[rank])
        services = dict(zip(leaders, self._get(
            ray, [w.start_service.remote(key) for w in leaders.values()],
            "start the workers' command services", self.settings.start_timeout)))
        left = max(1.0, self.settings.start_timeout - (time.monotonic() - started))
        self._job = PairedJob(hosts, addresses, key, services=services,
                              network_interfaces=sorted(self.settings.nics or []),
                              verbose=self.settings.verbose >= 2)
        pairs = [w.pair.remote(rank, left) for rank, w in enumerate(self.workers)]
        self._get(ray, pairs, "start the ranks", left + 5.0)
        if executable_cls is not None:
            payload = _pickled(paired.start_executable, executable_cls, list(executable_args or []),
                               dict(executable_kwargs or {}))
            self._get(ray, [w.execute_pickled.remote(payload) for w in self.workers],
                      "create the executables", None)

    def shutdown(self) -> None:
        """Stop the ranks, end the actors and remove the placement group this executor
        made. Calling it again does nothing."""
        if self._elastic is not None:
            self._elastic.shutdown()
        ray = sys.modules.get("ray")
        if ray is not None and self.workers:
            refs = [w.close_link.remote() for w in self.workers]
            try:
                ray.wait(refs, num_returns=len(refs), timeout=5.0)
            except Exception:
                pass
        if self._job is not None:
            if not self._job.wait(10.0):
                self._job.stop()
            self._job = None
        if ray is not None and self.workers:
            refs = [w.stop_service.remote() for w in self.workers]
            try:
                ray.wait(refs, num_returns=len(refs), timeout=5.0)
            except Exception:
                pass
        if self.strategy is not None:
            self.strategy.shutdown()
            self.strategy = None
        self.workers = []

    # Running functions.
    def execute(self, fn: Callable[[Any], Any], callbacks: list[Callable] | None = None) -> list[Any]:
        """Run ``fn(executable)`` on every worker and return the values, ordered by rank
        (``executable`` is the object ``start(executable_cls=...)`` created, else None).

        If a rank raises, the executor ends the job (the other ranks may be waiting for
        it in a collective) and raises that exception, with the rank's traceback."""
        del callbacks
        if self._elastic is not None:
            raise NotImplementedError("RayExecutor.execute with min_workers: an elastic job runs "
                                      "one function, through run()")
        ray = self._ready()
        payload = _pickled(paired.apply_to_executable, fn)
        return self._get(ray, [w.execute_pickled.remote(payload) for w in self.workers],
                         "run the function", None, fatal=True)

    def run(self, fn: Callable[..., Any], args: list | None = None, kwargs: dict | None = None,
            callbacks: list[Callable] | None = None) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every worker and return the values, ordered by
        rank. A rank that raises ends the job, as in :meth:`execute`."""
        if self._elastic is not None:
            return self._elastic.run(fn, args, kwargs, callbacks)
        del callbacks
        ray = self._ready()
        payload = _pickled(fn, *(args or []), **(kwargs or {}))
        return self._get(ray, [w.execute_pickled.remote(payload) for w in self.workers],
                         "run the function", None, fatal=True)

    def run_remote(self, fn: Callable[..., Any], args: list | None = None,
                   kwargs: dict | None = None) -> list[Any]:
        """As :meth:`run`, but returns the Ray object references at once, ordered by
        rank. A rank that raises does not end the job here: call :meth:`shutdown`."""
        if self._elastic is not None:
            raise NotImplementedError("RayExecutor.run_remote with min_workers: use run()")
        self._ready()
        payload = _pickled(fn, *(args or []), **(kwargs or {}))
        return [w.execute_pickled.remote(payload) for w in self.workers]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(executable)`` on rank 0 only and return its value."""
        if self._elastic is not None:
            raise NotImplementedError("RayExecutor.execute_single with min_workers: use run()")
        ray = self._ready()
        payload = _pickled(paired.apply_to_executable, fn)
        return self._get(ray, [self.workers[0].execute_pickled.remote(payload)],
                         "run the function", None, fatal=True)[0]

    def _ready(self) -> Any:
        ray = _import_ray()
        if self._broken:
            raise RuntimeError(f"RayExecutor: {self._broken}; call shutdown() and start() again")
        if not self.workers:
            raise RuntimeError("RayExecutor: not started; call start() first")
        return ray

    def _get(self, ray: Any, refs: list[Any], what: str, timeout: float | None,
             fatal: bool = False) -> list[Any]:
        """``ray.get(refs)``, watching the job: the first error (or the job's end, or
        ``timeout``) ends the wait. With ``fatal``, an error ends the job first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5,
                                         fetch_local=True)
                for ref in done:
                    ray.get(ref)  # raises the first error
                if not pending:
                    break
                if self._job is not None and not self._job.running and not fatal:
                    raise RuntimeError(f"RayExecutor: could not {what}: {self._job.describe_end()}")
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"RayExecutor: could not {what} within {timeout:g} s "
                                       f"({len(pending)} of {len(refs)} worker(s) did not answer)")
        except BaseException as exc:
            # Ray re-raises a worker's exception wrapped, with the rank's traceback (a
            # note on the original) cut short: show it in full under the caller's.
            for note in getattr(getattr(exc, "cause", None), "__notes__", None) or []:
                if hasattr(exc, "add_note") and note not in getattr(exc, "__notes__", []):
                    exc.add_note(note)
            if fatal:
                self._broken = f"a worker failed ({type(exc).__name__})"
                self.shutdown()
            raise
        return ray.get(list(refs))
