"""The Ray actor that hosts one rank: :class:`BaseHorovodWorker`, Horovod's name."""
from __future__ import annotations

import os
import socket
from typing import Any, Callable

from hvdlite.runner import paired


class BaseHorovodWorker:
    """One worker of a :class:`~hvdlite.ray.RayExecutor`: a Ray actor paired with one
    MPI rank, which runs every function the executor sends (see
    :mod:`hvdlite.runner.paired`).

    Before its rank is paired (or used on its own, as ``ray.remote(BaseHorovodWorker)``),
    it works on its own process: ``update_env_vars`` and ``env_vars`` then read and
    write this actor's environment, and ``execute`` runs here."""

    def __init__(self, world_rank: int = 0, world_size: int = 1) -> None:
        os.environ["HOROVOD_RANK"] = str(world_rank)
        os.environ["HOROVOD_SIZE"] = str(world_size)
        self.executable: Any = None
        self._link: paired.RankLink | None = None
        self._service: Any = None

    # Where this actor is.
    def hostname(self) -> str:
        return socket.gethostname()

    def node_id(self) -> str:
        import ray
        return ray.get_runtime_context().get_node_id()

    def get_gpu_ids(self) -> list[int]:
        import ray
        return [int(g) if str(g).isdigit() else g for g in ray.get_gpu_ids()]

    def describe(self) -> dict[str, Any]:
        """Hostname, Ray node, address and GPUs: what the executor places ranks by."""
        import ray
        return {"hostname": self.hostname(), "node_id": self.node_id(),
                "ip": ray.util.get_node_ip_address(), "gpu_ids": self.get_gpu_ids(),
                "pid": os.getpid()}

    # Environment.
    def update_env_vars(self, env_vars: dict[str, Any]) -> None:
        """Set variables in this actor and, once paired, in its rank."""
        values = {str(k): str(v) for k, v in env_vars.items()}
        os.environ.update(values)
        if self._link is not None:
            self._link.call(paired.update_environment, (values,))

    def env_vars(self) -> dict[str, str]:
        """The environment where functions run: the rank's once paired."""
        if self._link is not None:
            return self._link.call(lambda: dict(os.environ))
        return dict(os.environ)

    # Pairing with the rank.
    def open_link(self, key: str) -> str:
        """Start listening for this actor's rank; returns the address it connects to."""
        if self._link is not None:
            self._link.close()
        self._link = paired.RankLink(key)
        return self._link.address

    def pair(self, rank: int, timeout: float) -> int:
        """Wait for the rank to connect; returns its process id."""
        assert self._link is not None, "open_link first"
        self._link.accept(rank, timeout)
        return self._link.call(os.getpid)

    def start_service(self, key: str) -> str:
        """Serve Open MPI's agent on this host (see :mod:`hvdlite.runner.remote`); returns
        the address it listens on."""
        import ray

        from hvdlite.runner.remote import CommandService
        if self._service is None:
            self._service = CommandService(key)
        return f"{ray.util.get_node_ip_address()}:{self._service.port}"

    def close_link(self) -> None:
        """Tell the rank to exit; the command service (if any) stays until the job ends."""
        if self._link is not None:
            link, self._link = self._link, None
            link.close()

    def stop_service(self) -> None:
        if self._service is not None:
            service, self._service = self._service, None
            service.close()

    # Running functions.
    def start_executable(self, executable_cls: type | None = None,
                         executable_args: list | None = None,
                         executable_kwargs: dict | None = None) -> None:
        args, kwargs = list(executable_args or []), dict(executable_kwargs or {})
        if executable_cls is None:
            return
        if self._link is not None:
            self._link.call(paired.start_executable, (executable_cls, args, kwargs))
        else:
            self.executable = executable_cls(*args, **kwargs)

    def execute(self, func: Callable[[Any], Any]) -> Any:
        """``func(executable)`` where the rank runs (here before pairing)."""
        if self._link is not None:
            return self._link.call(paired.apply_to_executable, (func,))
        return func(self.executable)

    def execute_pickled(self, payload: bytes) -> Any:
        """A call pickled by the driver with cloudpickle, ``(fn, args, kwargs)``, run
        where the rank runs. The driver pickles it rather than Ray, whose own copy of
        cloudpickle ignores ``cloudpickle.register_pickle_by_value``; this actor never
        unpickles the function, so it needs none of the caller's modules."""
        if self._link is not None:
            return paired.reply_value(self._link.call_pickled(payload), self._link.rank)
        import cloudpickle
        fn, args, kwargs = cloudpickle.loads(payload)
        return fn(*args, **kwargs)
