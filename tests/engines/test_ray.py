"""``hvdlite.ray.RayExecutor`` on a real Ray instance (``ray.init`` on this machine):
ranks paired with actors, state kept between calls, values by rank, and every failure
named on the driver with nothing left running."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'hvdlite[ray]')")

from hvdlite.ray import Coordinator, MiniSettings, RayExecutor  # noqa: E402
from hvdlite.ray.worker import BaseHorovodWorker  # noqa: E402
from tests.engines.common import (allreduce_rank, paired_ranks, raise_on_rank_one,  # noqa: E402
                                  reference_linear, train_linear, wait_for_no_paired_ranks)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_cluster():
    """One Ray instance for the module: 4 CPUs and 4 (declared, not real) GPUs."""
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def executor(ray_cluster, request):
    made = []

    def make(**kwargs):
        ex = RayExecutor(RayExecutor.create_settings(timeout_s=120), **kwargs)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.shutdown()
    assert wait_for_no_paired_ranks() == []


@pytest.mark.parametrize("n", [1, 2, 3])
def test_run_returns_values_by_rank_and_ranks_keep_their_state(executor, n):
    ex = executor(num_workers=n)
    ex.start()
    got = ex.run(allreduce_rank, args=[0.5], kwargs={"offset": 1})
    total = sum(r + 1 for r in range(n)) * 0.5
    assert got == [(r, n, [total] * 3) for r in range(n)]

    def remember(value):
        import builtins
        builtins._hvdlite_test_value = value
        return os.getpid()

    pids = ex.run(remember, args=["kept"])
    assert len(set(pids)) == n and os.getpid() not in pids
    # The same processes, with what the last call left, and hvd.init() already done.
    assert ex.run(lambda: (os.getpid(), __import__("builtins")._hvdlite_test_value)) == \
        [(p, "kept") for p in pids]
    assert ex.execute_single(lambda _: __import__("hvdlite").rank()) == 0


def test_executable_class_run_remote_and_environment(executor):
    class Executable:
        def __init__(self, epochs):
            import hvdlite as hvd
            hvd.init()
            self.hvd = hvd
            self.epochs = epochs

        def rank_epoch(self):
            return self.hvd.rank() * self.epochs

    ex = executor(num_hosts=1, num_workers_per_host=3)
    ex.start(executable_cls=Executable, executable_args=[2],
             extra_env_vars={"HVDLITE_TEST_EXTRA": "x1"})
    assert ex.execute(lambda w: w.rank_epoch()) == [0, 2, 4]
    refs = ex.run_remote(lambda a: a + __import__("hvdlite").rank(), args=[10])
    assert ray.get(refs) == [10, 11, 12]
    ray.get([w.update_env_vars.remote({"HVDLITE_TEST_LATER": 7}) for w in ex.workers])
    envs = ex.execute(lambda _: dict(os.environ))
    assert [e["HOROVOD_RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["HOROVOD_LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["HVDLITE_TEST_EXTRA"] for e in envs} == {"x1"}
    assert {e["HVDLITE_TEST_LATER"] for e in envs} == {"7"}
    assert ray.get(ex.workers[2].env_vars.remote())["HVDLITE_TEST_LATER"] == "7"


def test_gpu_workers_see_every_gpu_of_their_node(executor):
    ex = executor(num_workers=2, use_gpu=True)
    ex.start()
    ids = ray.get([w.get_gpu_ids.remote() for w in ex.workers])
    assert sorted(len(i) for i in ids) == [1, 1]
    want = ",".join(str(g) for g in sorted({g for i in ids for g in i}, key=str))
    assert ex.execute(lambda _: os.environ["CUDA_VISIBLE_DEVICES"]) == [want, want]


def test_same_parameters_as_one_process(executor):
    ex = executor(num_workers=3)
    ex.start()
    got = np.array(ex.run(train_linear, args=[7]))
    np.testing.assert_allclose(got, np.tile(reference_linear(7, 3), (3, 1)), rtol=1e-12)


def test_a_rank_that_raises_ends_the_job_with_its_traceback(executor):
    ex = executor(num_workers=2)
    ex.start()
    started = time.monotonic()
    with pytest.raises(KeyError, match="rank one refuses") as info:
        ex.run(raise_on_rank_one)
    assert time.monotonic() - started < 60
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "on rank 1" in notes and "in raise_on_rank_one" in notes
    assert ex.workers == [] and wait_for_no_paired_ranks() == []
    with pytest.raises(RuntimeError, match="a worker failed"):
        ex.run(allreduce_rank, args=[1.0])


def test_a_killed_actor_ends_the_job_with_a_clear_error(executor):
    ex = executor(num_workers=2)
    ex.start()
    pids = ex.run(os.getpid)
    refs = ex.run_remote(time.sleep, args=[60])
    time.sleep(1.0)
    ray.kill(ex.workers[1])
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        ray.get(refs, timeout=30)
    assert time.monotonic() - started < 20
    assert "RankLost" in repr(info.value) or "ActorDied" in repr(info.value) \
        or "died" in str(info.value)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or wait_for_no_paired_ranks() == []


def test_infeasible_placement_times_out_with_the_numbers(ray_cluster):
    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=3)
    for kwargs in ({"num_workers": 6}, {"num_hosts": 1, "num_workers_per_host": 6}):
        ex = RayExecutor(settings, **kwargs)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"6 bundle|1 bundle.*6") as info:
            ex.start()
        assert time.monotonic() - started < 15
        assert "4 CPU" in str(info.value)
        ex.shutdown()
    assert ray.util.placement_group_table() == {} or all(
        pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())
    assert paired_ranks() == []


def test_bad_arguments_are_refused_by_name():
    s = MiniSettings()
    with pytest.raises(ValueError, match="Both `min_workers` and `num_workers` provided"):
        RayExecutor(s, num_workers=2, min_workers=1)
    with pytest.raises(ValueError, match="`max_workers` provided without any positive"):
        RayExecutor(s, max_workers=2)
    with pytest.raises(ValueError, match="use_gpu must be True"):
        RayExecutor(s, num_workers=2, gpus_per_worker=1)
    with pytest.raises(ValueError, match="num_workers must be at least 1"):
        RayExecutor(s, num_workers=0)
    with pytest.raises(NotImplementedError, match="Gloo rendezvous"):
        Coordinator(s).establish_rendezvous()


def test_gloo_settings_are_refused(executor):
    ex = executor(num_workers=1)
    with pytest.raises(ValueError, match="HOROVOD_CONTROLLER=gloo.*MPI only"):
        ex.start(extra_env_vars={"HOROVOD_CONTROLLER": "gloo"})
    assert ex.workers == []


def test_worker_works_on_its_own_before_pairing(ray_cluster):
    actor = ray.remote(BaseHorovodWorker).remote()
    ray.get(actor.update_env_vars.remote({"TEST": 1123123}))
    assert ray.get(actor.env_vars.remote())["TEST"] == "1123123"
    assert ray.get(actor.execute.remote(lambda w: w)) is None
    ray.kill(actor)


def test_coordinator_gives_local_and_cross_ranks_per_node():
    coord = Coordinator(MiniSettings())
    for r in range(12):
        coord.register(["a", "b", "c"][r % 3], node_id=str(r % 3), world_rank=r)
    info = coord.finalize_registration()
    assert sorted(info) == list(range(12))
    assert {i["HOROVOD_LOCAL_SIZE"] for i in info.values()} == {4}
    assert {i["HOROVOD_CROSS_SIZE"] for i in info.values()} == {3}
    assert [info[r]["HOROVOD_LOCAL_RANK"] for r in (0, 3, 6, 9)] == [0, 1, 2, 3]
    assert [info[r]["HOROVOD_CROSS_RANK"] for r in (0, 1, 2)] == [0, 1, 2]
    # Nodes of unequal size: only the nodes that have a local rank count for its cross size.
    coord = Coordinator(MiniSettings())
    for r in range(7):
        coord.register("h", node_id="big" if r < 5 else "small", world_rank=r)
    info = coord.finalize_registration()
    assert [info[r]["HOROVOD_CROSS_SIZE"] for r in range(5)] == [2, 2, 1, 1, 1]
    assert [info[r]["HOROVOD_CROSS_RANK"] for r in (5, 6)] == [1, 1]


def test_elastic_executor_returns_the_last_worlds_values_by_rank(ray_cluster):
    # One node of 4 CPUs: 4 slots, of which max_workers takes 3.
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=2, max_workers=3)
    try:
        ex.start()
        assert ex.run(allreduce_rank, args=[1.0]) == [(r, 3, [3.0] * 3) for r in range(3)]
        for call in (lambda: ex.execute(lambda _: 1), lambda: ex.run_remote(os.getpid),
                     lambda: ex.execute_single(lambda _: 1)):
            with pytest.raises(NotImplementedError, match="use run|through run"):
                call()
        with pytest.raises(RuntimeError, match=r"raise_on_rank_one raised:(.|\n)*rank one refuses"):
            ex.run(raise_on_rank_one)
    finally:
        ex.shutdown()
    assert wait_for_no_paired_ranks() == []


def test_host_discovery_counts_slots_of_live_nodes(monkeypatch):
    from hvdlite.ray.elastic import RayHostDiscovery
    nodes = [
        {"NodeID": "a", "Alive": True, "NodeManagerAddress": "10.0.0.1",
         "Resources": {"CPU": 8.0, "GPU": 2.0}},
        {"NodeID": "b", "Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 3.0}},
        {"NodeID": "c", "Alive": False, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 8.0}},
        {"NodeID": "d", "Alive": True, "NodeManagerAddress": "10.0.0.4", "Resources": {"CPU": 1.0}},
    ]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    assert RayHostDiscovery(cpus_per_worker=2).find_available_hosts_and_slots() == \
        {"10.0.0.1": 4, "10.0.0.2": 1}
    assert RayHostDiscovery(use_gpu=True, cpus_per_worker=1, gpus_per_worker=1) \
        .find_available_hosts_and_slots() == {"10.0.0.1": 2}
