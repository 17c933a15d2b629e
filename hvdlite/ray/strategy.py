"""Where a :class:`~hvdlite.ray.RayExecutor`'s actors go: placement groups as Horovod
makes them (``num_hosts`` given: one bundle per host, ``STRICT_SPREAD``; otherwise one
bundle per worker, ``PACK``, or the placement group the caller runs in)."""
from __future__ import annotations

from typing import Any

from hvdlite.ray.worker import BaseHorovodWorker


def create_placement_group(resources_per_bundle: dict[str, float], num_bundles: int,
                           pg_timeout: float, pg_strategy: str) -> tuple[Any, list[dict]]:
    """Create a placement group of ``num_bundles`` copies of ``resources_per_bundle``
    and wait up to ``pg_timeout`` seconds for Ray to reserve it; ``TimeoutError`` (with
    what was asked and what the cluster has free) when it cannot."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [{k: v for k, v in resources_per_bundle.items() if v} for _ in range(num_bundles)]
    pg = placement_group(bundles, strategy=pg_strategy)
    ready, _ = ray.wait([pg.ready()], timeout=pg_timeout)
    if not ready:
        remove_placement_group(pg)
        raise TimeoutError(
            f"Ray could not place {num_bundles} bundle(s) of {bundles[0] if bundles else {}} "
            f"({pg_strategy}) within {pg_timeout:g} s; the cluster has "
            f"{_resources_text(ray.cluster_resources())} in all and "
            f"{_resources_text(ray.available_resources())} free")
    return pg, bundles


def _resources_text(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if k in ("CPU", "GPU")}
    return ", ".join(f"{v:g} {k}" for k, v in sorted(shown.items())) or "no CPU"


class BaseStrategy:
    """Creates the workers (actors) and keeps the placement group it made."""

    placement_group: Any = None
    _created_placement_group = False

    def __init__(self, settings: Any, use_gpu: bool, cpus_per_worker: float,
                 gpus_per_worker: float | None) -> None:
        self.settings = settings
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.workers: list[Any] = []

    @property
    def num_workers(self) -> int:
        raise NotImplementedError

    def _actor(self, bundle_index: int, world_rank: int) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(BaseHorovodWorker).options(
            num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=bundle_index,
                placement_group_capture_child_tasks=False))
        return remote.remote(world_rank=world_rank, world_size=self.num_workers)

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:
                pass
        self.workers = []
        if self._created_placement_group and self.placement_group is not None:
            try:
                remove_placement_group(self.placement_group)
            except Exception:
                pass
            self.placement_group = None
            self._created_placement_group = False


class ColocatedStrategy(BaseStrategy):
    """``num_hosts`` hosts with ``num_workers_per_host`` workers each, one bundle per
    host, no two bundles on one node (``STRICT_SPREAD``)."""

    def __init__(self, *, settings: Any, num_hosts: int, num_workers_per_host: int,
                 use_gpu: bool, cpus_per_worker: float, gpus_per_worker: float | None) -> None:
        super().__init__(settings, use_gpu, cpus_per_worker, gpus_per_worker)
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host

    @property
    def num_workers(self) -> int:
        return int(self.num_hosts * self.num_workers_per_host)

    def create_workers(self) -> list[Any]:
        per_host = {"CPU": self.cpus_per_worker * self.num_workers_per_host,
                    "GPU": self.gpus_per_worker * self.num_workers_per_host}
        self.placement_group, _ = create_placement_group(
            per_host, self.num_hosts, self.settings.placement_group_timeout_s, "STRICT_SPREAD")
        self._created_placement_group = True
        self.workers = [self._actor(b, b * self.num_workers_per_host + i)
                        for b in range(self.num_hosts) for i in range(self.num_workers_per_host)]
        return self.workers


class PGStrategy(BaseStrategy):
    """``num_workers`` workers, in the caller's placement group when it runs in one and
    ``use_current_placement_group`` is on, else in a new one of one bundle per worker
    (``PACK``)."""

    def __init__(self, *, settings: Any, num_workers: int, use_gpu: bool,
                 cpus_per_worker: float, gpus_per_worker: float | None,
                 placement_group: Any = None) -> None:
        super().__init__(settings, use_gpu, cpus_per_worker, gpus_per_worker)
        self._num_workers = num_workers
        self.placement_group = placement_group

    @property
    def num_workers(self) -> int:
        return int(self._num_workers)

    def create_workers(self) -> list[Any]:
        if self.placement_group is None:
            self.placement_group, _ = create_placement_group(
                {"CPU": self.cpus_per_worker, "GPU": self.gpus_per_worker}, self.num_workers,
                self.settings.placement_group_timeout_s, "PACK")
            self._created_placement_group = True
        own = self._created_placement_group
        self.workers = [self._actor(i if own else -1, i) for i in range(self.num_workers)]
        return self.workers
