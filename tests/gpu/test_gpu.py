"""The GPU path on the fake CUDA runtime and fake NCCL (tests/fake_cuda), through the
real launcher, at 2 and 4 ranks: every collective and dtype against NumPy, fusion,
host and GPU tensors together, ordering under the fake's stream delay, errors on every
rank, NCCL failures and a stalled peer, missing libraries, shutdown and init() again,
the timeline; and the library loader against the real NCCL wheel where it is
installed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch import REPO, run_job

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def fake_cuda(tmp_path_factory) -> Path:
    """The fake libcudart.so and libnccl.so, built once per session."""
    if not shutil.which("g++"):
        pytest.skip("g++ is needed to build the fake CUDA runtime and NCCL")
    out = tmp_path_factory.mktemp("fake_cuda")
    subprocess.run(["bash", str(REPO / "tests" / "fake_cuda" / "build.sh"), str(out)], check=True,
                   capture_output=True, text=True)
    return out


def gpu_env(fake: Path, tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        "HVDLITE_CUDART_LIBRARY": str(fake / "libcudart.so"),
        "HVDLITE_NCCL_LIBRARY": str(fake / "libnccl.so"),
        "FAKE_CUDA_DIR": str(fake),
        "HVDLITE_FAKE_NCCL_LOG": str(tmp / "nccl.log"),
        "HVDLITE_FAKE_CUDA_LOG": str(tmp / "cuda.log"),
        "HVDLITE_FAKE_CUDA_DELAY_US": "300",
        "GPU_TIMELINE": str(tmp / "timeline.json"),
    }
    env.update(extra)
    return env


def assert_passed(proc: subprocess.CompletedProcess, n: int, marker: str = "ALL CHECKS PASSED") -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"job failed ({proc.returncode}):\n{out[-8000:]}"
    for r in range(n):
        assert f"{marker} rank {r}" in proc.stdout, f"rank {r} did not finish:\n{out[-8000:]}"


def log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("n", [2, 4])
def test_gpu_collectives_on_fake_nccl(fake_cuda: Path, tmp_path: Path, n: int) -> None:
    proc = run_job(n, HERE / "gpu_checks.py", env=gpu_env(fake_cuda, tmp_path), timeout=600)
    assert_passed(proc, n)
    nccl = log_lines(tmp_path / "nccl.log")
    calls = {line.split(" ", 1)[0] for line in nccl}
    for name in ("ncclCommInitRank", "ncclAllReduce", "ncclBroadcast", "ncclAllGather", "ncclSend", "ncclRecv",
                 "ncclReduceScatter", "ncclRedOpCreatePreMulSum", "ncclCommDestroy"):
        assert name in calls, f"{name} never called; calls: {sorted(calls)}"
    # Two engines (init, then init again after shutdown) on every rank.
    assert sum(line.startswith("ncclCommInitRank") for line in nccl) == 2 * n
    # Nothing on the hot path waits for the whole device.
    cuda = log_lines(tmp_path / "cuda.log")
    assert not [line for line in cuda if line.startswith("cudaDeviceSynchronize")], cuda[:5]
    assert "FUSION rank 0" in proc.stdout


def test_one_rank_average_and_scaling_avoid_nccls_one_rank_kernel(fake_cuda: Path, tmp_path: Path) -> None:
    proc = run_job(1, HERE / "gpu_checks.py", "check_allreduce", "check_scaled_allreduce",
                   "check_one_rank_average_and_scaling", env=gpu_env(fake_cuda, tmp_path), timeout=300)
    assert_passed(proc, 1)
    assert "PASS check_one_rank_average_and_scaling rank 0" in proc.stdout


def test_gpu_operations_through_host_mpi(fake_cuda: Path, tmp_path: Path) -> None:
    """HOROVOD_GPU_OPERATIONS=MPI: the same checks with GPU tensors staged through host
    memory and MPI, and no NCCL collective at all."""
    env = gpu_env(fake_cuda, tmp_path, HOROVOD_GPU_OPERATIONS="MPI")
    proc = run_job(3, HERE / "gpu_checks.py", "check_allreduce", "check_scaled_allreduce",
                   "check_gather_bcast_alltoall_reducescatter", "check_mixed_cycle", "check_ordering_under_delay",
                   "check_errors", env=env, timeout=600)
    assert_passed(proc, 3)
    calls = {line.split(" ", 1)[0] for line in log_lines(tmp_path / "nccl.log")}
    assert not calls & {"ncclAllReduce", "ncclBroadcast", "ncclAllGather", "ncclSend", "ncclReduceScatter"}, calls


def test_gpu_allreduce_alone_through_host_mpi(fake_cuda: Path, tmp_path: Path) -> None:
    """HOROVOD_GPU_ALLREDUCE=MPI moves only allreduce to the host path."""
    env = gpu_env(fake_cuda, tmp_path, HOROVOD_GPU_ALLREDUCE="MPI")
    proc = run_job(2, HERE / "gpu_checks.py", "check_allreduce", "check_gather_bcast_alltoall_reducescatter",
                   env=env, timeout=600)
    assert_passed(proc, 2)
    calls = {line.split(" ", 1)[0] for line in log_lines(tmp_path / "nccl.log")}
    assert "ncclAllReduce" not in calls and "ncclBroadcast" in calls, calls


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_nccl_failure_fails_every_rank(fake_cuda: Path, tmp_path: Path, mode: str) -> None:
    var = "HVDLITE_FAKE_NCCL_FAIL" if mode == "sync" else "HVDLITE_FAKE_NCCL_ASYNC_FAIL"
    env = gpu_env(fake_cuda, tmp_path, **{var: "ncclAllReduce:1:3", "FAILING_RANK": "1"})
    proc = run_job(3, HERE / "gpu_failure_job.py", "nccl_error", env=env, timeout=180)
    assert_passed(proc, 3, "nccl_error OK")


def test_stalled_peer_is_aborted_within_the_stall_limit(fake_cuda: Path, tmp_path: Path) -> None:
    env = gpu_env(fake_cuda, tmp_path, HVDLITE_FAKE_NCCL_ASYNC_FAIL="ncclAllReduce:1:2",
                  HVDLITE_FAKE_NCCL_ASYNC_MODE="stall", HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="3",
                  FAILING_RANK="1")
    proc = run_job(2, HERE / "gpu_failure_job.py", "stalled_peer", env=env, timeout=180)
    assert_passed(proc, 2, "stalled_peer OK")
    assert "ncclCommAbort" in {line.split(" ", 1)[0] for line in log_lines(tmp_path / "nccl.log")}


@pytest.mark.parametrize("missing", ["nccl", "runtime"])
def test_missing_gpu_library_is_an_error_on_every_rank(fake_cuda: Path, tmp_path: Path, missing: str) -> None:
    env = gpu_env(fake_cuda, tmp_path)
    env["HVDLITE_NCCL_LIBRARY" if missing == "nccl" else "HVDLITE_CUDART_LIBRARY"] = str(tmp_path / "absent.so")
    proc = run_job(2, HERE / "gpu_failure_job.py", f"missing_{'nccl' if missing == 'nccl' else 'runtime'}",
                   env=env, timeout=180)
    assert_passed(proc, 2, f"missing_{'nccl' if missing == 'nccl' else 'runtime'} OK")


def test_loader_opens_the_real_nccl_wheel() -> None:
    """The nvidia-nccl-cu12/-cu13 wheel loads without a GPU: version and unique id work
    through hvdlite's loader (communicators need a device)."""
    from hvdlite.common import gpu_libraries
    folders = gpu_libraries.search_folders()["nccl"]
    if not any(Path(f, "libnccl.so.2").exists() for f in folders):
        pytest.skip("no nvidia-nccl wheel installed (pip install 'hvdlite[gpu]' brings it)")
    code = ("import os; os.environ.pop('HVDLITE_NCCL_LIBRARY', None)\n"
            "from hvdlite.common import basics, gpu_libraries\n"
            "info = gpu_libraries.describe(basics._load_core())\n"
            "print(info['nccl'])\n"
            "assert info['nccl']['loaded'], info\n"
            "assert 'nvidia' in info['nccl']['path'], info\n"
            "assert basics._load_core().nccl_unique_id_works()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def real_gpus() -> int:
    """GPUs CuPy sees (0 without CuPy or without a GPU)."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device
        return 0


@pytest.mark.timeout(300)
def test_cupy_arrays_on_a_real_gpu() -> None:
    """The NumPy front end with CuPy arrays on real GPUs and the real NCCL, one rank per
    GPU (skipped on machines without CuPy and a GPU, such as CI's)."""
    gpus = real_gpus()
    if gpus < 1:
        pytest.skip("needs CuPy and a CUDA GPU")
    proc = run_job(gpus, HERE / "cupy_checks.py", timeout=250)
    assert_passed(proc, gpus)


def test_check_build_and_nccl_built_say_where_nccl_comes_from(fake_cuda: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HVDLITE_CUDART_LIBRARY": str(fake_cuda / "libcudart.so"),
           "HVDLITE_NCCL_LIBRARY": str(fake_cuda / "libnccl.so")}
    out = subprocess.run([sys.executable, "-m", "hvdlite.runner", "--check-build"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=REPO).stdout
    assert f"[X] NCCL 2.23.3 (loaded at run time from {fake_cuda / 'libnccl.so'})" in out, out
    assert "CUDA runtime: 12.8" in out and "8 GPU(s) visible" in out, out
    code = "import hvdlite as hvd; print(hvd.nccl_built(), hvd.cuda_built())"
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert probe.stdout.split() == ["22303", "True"], probe.stdout + probe.stderr
    env["HVDLITE_NCCL_LIBRARY"] = str(tmp_path / "absent.so")
    out = subprocess.run([sys.executable, "-m", "hvdlite.runner", "--check-build"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=REPO).stdout
    assert "[ ] NCCL (not found: hvdlite could not load NCCL" in out, out
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert probe.stdout.split() == ["0", "True"], probe.stdout + probe.stderr


@pytest.mark.timeout(300)
def _host_cost_rows(tmp_path: Path, np_: int) -> dict[str, dict]:
    out = tmp_path / f"bench_gpu_host_{np_}.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_gpu_host.py"), "--np", str(np_),
                           "--iters", "40", "--reps", "2", "--results", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 6, sorted(rows)
    for name, r in rows.items():
        assert r["step_us"] > 0, (name, r)
    return rows


def test_host_cost_benchmark_runs_and_cache_hits_skip_rank_zero(tmp_path: Path) -> None:
    """benchmarks/bench_gpu_host.py, short, on the fake runtime. At 2 ranks: every
    workload gives a time per step, and in the steady state every request (GPU and host
    memory, a new request or a persistent one) is agreed as a response-cache id in the
    ranks' cycles, none through rank 0. At 1 rank, where the engine is idle at every
    submit: GPU requests are queued on the device by the submitting thread itself (no
    hand-off to the engine's thread), host-memory ones never are. (Timings are not
    checked: that is the benchmark's job.)"""
    if not shutil.which("g++"):
        pytest.skip("g++ is needed to build the fake CUDA runtime and NCCL")
    for name, r in _host_cost_rows(tmp_path, 2).items():
        assert r["requests_through_rank0"] == 0, (name, r)
        assert r["requests_as_cache_ids"] == 2 * 40 * r["collectives_per_step"], (name, r)
    for name, r in _host_cost_rows(tmp_path, 1).items():
        requests = 2 * 40 * r["collectives_per_step"]
        if name.startswith("host memory"):
            assert r["requests_queued_by_submitter"] == 0, (name, r)
        else:  # the background thread may hold the engine now and then (its idle looks)
            assert r["requests_queued_by_submitter"] >= requests // 2, (name, r)
