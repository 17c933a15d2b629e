"""Elastic training on Ray: ``RayExecutor(min_workers=...)`` and Horovod's older
``ElasticRayExecutor``.

The job is ``hvdlite-run``'s elastic job (see the elastic guide), with Ray's live nodes
as its hosts: a thread of the driver keeps one host actor on every live node that can
take a worker. The actor reserves the node's worker slots and runs the command service
through which Open MPI starts its daemon there (:mod:`hvdlite.runner.remote`); the
launch's host discovery script prints the nodes whose actor is up. A node that dies
takes its actor, its daemon and its workers with it: the others go on from their last
commit, as under ``hvdlite-run``. A node that joins gets an actor, appears in the
discovery output, and the job grows onto it.

Each worker runs the function once (``hvd.elastic.run`` inside it does the resets) and
returns its value with its rank at the end; :meth:`ElasticRayExecutor.run` returns the
values of the last world, ordered by rank.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import cloudpickle

from hvdlite.runner import remote
from hvdlite.runner.function import ADDRESS_ENV, DRIVER_ENV, KEY_ENV, Driver, func_name


class RayHostDiscovery:
    """Ray's live nodes and the worker slots each offers: its CPUs // ``cpus_per_worker``,
    and with GPUs at most its GPUs // ``gpus_per_worker`` (Horovod's rule)."""

    def __init__(self, use_gpu: bool = False, cpus_per_worker: float = 1,
                 gpus_per_worker: float = 1) -> None:
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker

    def _slots(self, resources: dict[str, float]) -> int:
        slots = int(resources.get("CPU", 0) // self.cpus_per_worker) if self.cpus_per_worker else 0
        if self.use_gpu:
            slots = min(slots, int(resources.get("GPU", 0) // self.gpus_per_worker))
        return slots

    def live_nodes(self) -> dict[str, tuple[str, int]]:
        """``{node id: (node address, slots)}`` of the live nodes with a slot."""
        import ray
        found = {}
        for node in ray.nodes():
            if not (node.get("Alive") or node.get("alive")):
                continue
            slots = self._slots(node.get("Resources", {}))
            if slots > 0:
                node_id = node.get("NodeID") or node["NodeManagerAddress"]
                found[node_id] = (node["NodeManagerAddress"], slots)
        return found

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """``{node address: slots}``, Horovod's form."""
        return {address: slots for address, slots in self.live_nodes().values()}


@dataclasses.dataclass
class _Host:
    actor: Any
    slots: int
    hostname: str | None = None
    address: str | None = None
    pending: Any = None  # the ObjectRef of the start-up call in flight


class _HostWatcher:
    """Keeps a host actor on each live node and the launch's view of them in files: the
    discovery output (``hostname:slots``) and the agent's map of command services."""

    def __init__(self, discovery: RayHostDiscovery, key: str, folder: str,
                 env_vars: dict[str, str], poll_s: float = 1.0) -> None:
        self.discovery = discovery
        self.key = key
        self.env_vars = env_vars
        self.poll_s = poll_s
        self.hosts: dict[str, _Host] = {}
        self.hosts_file = os.path.join(folder, "hosts")
        self.services_file = os.path.join(folder, "services")
        self.script = os.path.join(folder, "discover-hosts")
        with open(self.script, "w") as f:
            f.write(f"#!/bin/sh\ncat {self.hosts_file}\n")
        os.chmod(self.script, 0o700)
        self._write()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hvdlite-ray-hosts", daemon=True)

    def start(self, timeout: float) -> None:
        """Place a host actor on every live node and wait (up to ``timeout`` seconds)
        for them to serve, so that the job starts on all of them."""
        deadline = time.monotonic() + timeout
        self.refresh()
        while any(h.address is None for h in self.hosts.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
            self.refresh()
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.refresh()
            except Exception as exc:  # Ray unreachable for a moment: try again
                print(f"hvdlite.ray: could not refresh the hosts: {exc}", file=sys.stderr)

    def refresh(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from hvdlite.ray.worker import BaseHorovodWorker

        live = self.discovery.live_nodes()
        changed = False
        for node_id in [n for n in self.hosts if n not in live]:
            self._drop(node_id)
            changed = True
        for node_id, (_, slots) in live.items():
            if node_id in self.hosts:
                continue
            gpus = self.discovery.gpus_per_worker * slots if self.discovery.use_gpu else 0
            actor = ray.remote(BaseHorovodWorker).options(
                num_cpus=self.discovery.cpus_per_worker * slots, num_gpus=gpus,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote()
            host = _Host(actor, slots)
            host.pending = actor.describe.remote()
            self.hosts[node_id] = host
        for node_id, host in list(self.hosts.items()):
            if host.pending is None:
                continue
            ready, _ = ray.wait([host.pending], timeout=0)
            if not ready:
                continue
            try:
                value = ray.get(host.pending)
            except Exception:
                self._drop(node_id)
                changed = True
                continue
            if host.hostname is None:
                host.hostname = value["hostname"]
                if self.env_vars:
                    host.actor.update_env_vars.remote(self.env_vars)
                host.pending = host.actor.start_service.remote(self.key)
            else:
                host.address = value
                host.pending = None
                changed = True
        if changed:
            self._write()

    def _drop(self, node_id: str) -> None:
        import ray
        host = self.hosts.pop(node_id)
        try:
            ray.kill(host.actor)
        except Exception:
            pass

    def ready(self) -> dict[str, int]:
        """``{hostname: slots}`` of the hosts whose actor serves."""
        found: dict[str, int] = {}
        for host in self.hosts.values():
            if host.address is not None and host.hostname is not None:
                found[host.hostname] = found.get(host.hostname, 0) + host.slots
        return found

    def _write(self) -> None:
        ready = self.ready()
        tmp = f"{self.hosts_file}.tmp"
        with open(tmp, "w") as f:
            f.write("".join(f"{h}:{n}\n" for h, n in ready.items()))
        os.replace(tmp, self.hosts_file)
        remote.write_services(self.services_file, {
            h.hostname: h.address for h in self.hosts.values() if h.address and h.hostname})

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0)
        for node_id in list(self.hosts):
            self._drop(node_id)


def _report(fn: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[int | None, int | None, Any]:
    """Runs on each worker: the function's value with the worker's rank and size at the
    end (the last world's). Rank 0's normal exit tells the launcher that training
    finished, as an elastic script's does under ``hvdlite-run``."""
    import hvdlite.common.membership  # noqa: F401  (registers that note at exit)
    value = fn(*args, **kwargs)
    import hvdlite
    if hvdlite.is_initialized():
        return hvdlite.rank(), hvdlite.size(), value
    return None, None, value


class ElasticRayExecutor:
    """Elastic training on Ray's live nodes (Horovod's ``ElasticRayExecutor``).

    ``settings`` come from :meth:`create_settings`. ``cpus_per_slot`` and
    ``gpus_per_slot`` (with ``use_gpu``) are each worker's resources; every live node
    offers as many slots as it has room for. ``env_vars`` are set on every worker.
    ``override_discovery`` is accepted: the hosts always come from Ray."""

    def __init__(self, settings: Any, use_gpu: bool = False, cpus_per_slot: float = 1,
                 gpus_per_slot: float | None = None, env_vars: dict[str, Any] | None = None,
                 override_discovery: bool = True) -> None:
        if gpus_per_slot is not None and not use_gpu:
            raise ValueError("gpus_per_slot is set, but use_gpu is False. use_gpu must be True "
                             "if gpus_per_slot is set.")
        self.settings = settings
        self.discovery = RayHostDiscovery(use_gpu, cpus_per_slot, gpus_per_slot or 1)
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        del override_discovery
        self._folder: str | None = None
        self._watcher: _HostWatcher | None = None

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None,
                        reset_limit: int | None = None, elastic_timeout: int = 600,
                        timeout_s: int = 30, ssh_identity_file: str | None = None,
                        nics: set[str] | None = None, min_np: int | None = None,
                        max_np: int | None = None, **kwargs: Any) -> "ElasticSettings":
        """Horovod's settings: the fewest and most workers (``min_np``/``max_np`` are
        the newer names), how many resets are allowed, and how long to wait for
        ``min_num_proc`` slots (``elastic_timeout``). ``ssh_identity_file`` is unused."""
        del ssh_identity_file, kwargs
        return ElasticSettings(min_np=min_np if min_np is not None else min_num_proc,
                               max_np=max_np if max_np is not None else max_num_proc,
                               reset_limit=reset_limit, elastic_timeout=elastic_timeout,
                               timeout_s=timeout_s, nics=set(nics) if nics else None)

    def start(self) -> None:
        """Start keeping a host actor on every live node (waiting up to the settings'
        ``timeout_s`` for the first ones to be up)."""
        import ray
        if ray.util.client.ray.is_connected():
            raise NotImplementedError("ElasticRayExecutor under Ray Client (ray://): run the driver "
                                      "on a node of the cluster")
        if self._watcher is not None:
            return
        self._folder = tempfile.mkdtemp(prefix="hvdlite-ray-elastic-")
        self._watcher = _HostWatcher(self.discovery, secrets.token_hex(32), self._folder,
                                     self.env_vars)
        self._watcher.start(float(self.settings.timeout_s))

    def run(self, worker_fn: Callable[..., Any], args: list | None = None,
            kwargs: dict | None = None, callbacks: list[Callable] | None = None) -> list[Any]:
        """Run ``worker_fn(*args, **kwargs)`` on the elastic job's workers until it
        returns on the last world's workers; their values, ordered by rank.

        Raises ``RuntimeError`` when a worker raises (with its traceback) or the job
        ends without every worker of the last world returning."""
        from hvdlite.runner.config import LaunchConfig
        from hvdlite.runner.launch import launch

        del callbacks
        if self._watcher is None:
            self.start()
        assert self._watcher is not None and self._folder is not None
        s = self.settings
        payload = cloudpickle.dumps((_report, (worker_fn, tuple(args or ()), dict(kwargs or {})), {}))
        driver = Driver(payload, s.min_np, "")
        try:
            import ray
            environ = dict(os.environ)
            environ.update(self.env_vars)
            environ[DRIVER_ENV] = f"{os.environ.get(ADDRESS_ENV) or ray.util.get_node_ip_address()}:{driver.port}"
            environ[KEY_ENV] = driver.key
            environ["PRTE_MCA_plm_ssh_agent"] = remote.write_agent(self._folder)
            environ[remote.SERVICES_ENV] = "@" + self._watcher.services_file
            environ[remote.KEY_ENV] = self._watcher.key
            # Start on every slot there is now (up to max_np): the job grows later only
            # by relaunching, and a job on fewer hosts than it could be loses more with
            # one of them.
            max_np = s.max_np or (1 << 16)
            num_proc = max(s.min_np, min(max_np, sum(self._watcher.ready().values())))
            config = LaunchConfig(
                num_proc=num_proc, min_np=s.min_np, max_np=max_np,
                host_discovery_script=self._watcher.script, reset_limit=s.reset_limit,
                elastic_timeout=s.elastic_timeout, cooldown_range=s.cooldown_range,
                command=[sys.executable, "-m", "hvdlite.ray._elastic_task"],
                network_interfaces=sorted(s.nics or []))
            returncode = launch(config, environ)
        finally:
            driver.close()
        if driver.errors:
            details = "\n".join(tb for _, tb in sorted(driver.errors.items()))
            raise RuntimeError(f"ElasticRayExecutor: {func_name(worker_fn)} raised:\n{details}")
        reports = list(driver.results.values())
        last = [r for r in reports if r[0] is not None]
        size = last[-1][1] if last else None
        by_rank = {rank: value for rank, n, value in last if n == size}
        if returncode != 0 or size is None or sorted(by_rank) != list(range(size)):
            raise RuntimeError(f"ElasticRayExecutor: the job ended with exit status {returncode}; "
                               f"values from {len(by_rank)} of {size or '?'} workers of the last world")
        return [by_rank[r] for r in range(size)]

    def shutdown(self) -> None:
        """End the host actors."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


@dataclasses.dataclass
class ElasticSettings:
    """What :meth:`ElasticRayExecutor.create_settings` returns."""

    min_np: int = 1
    max_np: int | None = None
    reset_limit: int | None = None
    elastic_timeout: int = 600
    timeout_s: int = 30
    nics: set[str] | None = None
    cooldown_range: tuple[int, int] | None = None
    verbose: int = 1
