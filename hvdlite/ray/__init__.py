"""hvdlite on Ray, with Horovod's API: :class:`RayExecutor` runs one MPI rank per Ray
actor (``pip install 'hvdlite[ray]'``). See the Ray guide."""
from hvdlite.ray.elastic import ElasticRayExecutor, RayHostDiscovery
from hvdlite.ray.runner import Coordinator, MiniSettings, RayExecutor
from hvdlite.ray.worker import BaseHorovodWorker

__all__ = ["BaseHorovodWorker", "Coordinator", "ElasticRayExecutor", "MiniSettings",
           "RayExecutor", "RayHostDiscovery"]
