"""The training benchmarks and a 64 MiB allreduce across hosts emulated with network
namespaces (``tests/hosts/emulated.py``).

``benchmarks/bench_torch_training.py --hosts 2`` (and the TensorFlow one) must run their
distributed peers across two emulated hosts and report throughput for each; a 64 MiB
allreduce through ``hvdlite-run -H h1:2,h2:2`` at 1 Gbit/s must give NumPy's sums
exactly, two-level and by default. Timings are printed, never asserted: the machine
is shared. Needs root: without it every test skips with the reason."""
from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosts.emulated import EmulatedHosts, _rate_bytes, unavailable
from tests.launch import REPO, job_env, run_job

HERE = Path(__file__).resolve().parent
ALLREDUCE64 = HERE / "allreduce_64mib_check.py"
REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def run_benchmark(script: str, tmp_path: Path, *args: str, timeout: float = 600) -> dict:
    """Runs ``benchmarks/SCRIPT ARGS --json-out F`` and returns F's contents."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / script), *args, "--json-out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (f"exit status {proc.returncode}: {' '.join(cmd)}\n"
                                  f"stdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}")
    print(proc.stdout[-3000:])
    return json.loads(out.read_text())


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_training_benchmark_across_two_hosts(tmp_path: Path) -> None:
    """DDP and hvdlite, one rank on each of 2 emulated hosts: both report positive
    samples/s, from ranks placed as asked, and the table's ratio follows."""
    data = run_benchmark("bench_torch_training.py", tmp_path, "--quick", "--models", "mlp",
                         "--hosts", "2", "--ranks", "2")
    runs = {r["mode"]: r for r in data["runs"]}
    for mode in ("ddp", "hvdlite"):
        assert mode in runs, data
        assert runs[mode]["samples_per_s"] > 0, runs[mode]
        assert runs[mode]["ranks"] == 2 and runs[mode]["hosts"] == "h1:1,h2:1", runs[mode]
    assert runs["single"]["samples_per_s"] > 0 and "hosts" not in runs["single"]
    (row,) = data["summary"]
    assert row["model"] == "mlp" and row["hvdlite_over_ddp"] > 0, row


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="tensorflow is not installed")
def test_tf_training_benchmark_across_two_hosts(tmp_path: Path) -> None:
    """hvdlite and MultiWorkerMirroredStrategy, one rank on each of 2 emulated hosts
    (custom loop, MLP): both report positive samples/s. The benchmark itself refuses to
    time a configuration whose first step differs from the single process's."""
    data = run_benchmark("bench_tf_training.py", tmp_path, "--quick", "--models", "mlp", "--apis", "loop",
                         "--modes", "single,hvdlite,mwms", "--hosts", "2", "--ranks", "2")
    (row,) = data["summary"]
    assert row["hosts"] == "h1:1,h2:1", row
    for mode in ("single", "hvdlite", "mwms"):
        assert row[mode] is not None and row[mode] > 0, row


@pytest.fixture(scope="module")
def hosts():
    with EmulatedHosts(2, rate="1gbit") as h:
        yield h


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed")
@pytest.mark.parametrize("mode", ["1", "default"])
def test_64mib_allreduce_through_hvdlite_run_H(hosts: EmulatedHosts, monkeypatch: pytest.MonkeyPatch,
                                               mode: str) -> None:
    """2 hosts x 2 ranks at 1 Gbit/s, ``hvdlite-run -H h1:2,h2:2``: a 64 MiB float32
    allreduce with HOROVOD_HIERARCHICAL_ALLREDUCE=1 and unset equals NumPy's sum on every
    rank, as does MPI_Allreduce on the same data. Prints both times against the link
    floor (each host sends 2(H-1)/H x 64 MiB through its link); asserts only results."""
    monkeypatch.delenv("HOROVOD_HIERARCHICAL_ALLREDUCE", raising=False)
    monkeypatch.delenv("HVDLITE_HIERARCHICAL_ALLREDUCE", raising=False)
    env = dict(hosts.env())
    if mode != "default":
        env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = mode
    proc = run_job(4, ALLREDUCE64, env=env, launcher_args=["-H", hosts.host_spec([2, 2])], timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{out[-8000:]}"
    assert sorted(line.split()[-1] for line in proc.stdout.splitlines()
                  if line.startswith("CHECK OK")) == ["h1", "h1", "h2", "h2"], out
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ALLREDUCE64 ")]
    assert len(lines) == 1, out
    res = json.loads(lines[0].split(" ", 1)[1])
    assert (res["ranks"], res["local_size"], res["cross_size"], res["hierarchical"]) == (4, 2, 2, mode), res
    floor = 2 * (2 - 1) / 2 * res["bytes"] / _rate_bytes(hosts.rate)
    hv, mpi = statistics.median(res["hvdlite"]), statistics.median(res["mpi"])
    print(f"\n64 MiB allreduce, 2 hosts x 2 ranks at {hosts.rate}, HOROVOD_HIERARCHICAL_ALLREDUCE={mode}: "
          f"hvdlite {hv:.3f} s ({hv / floor:.2f} x the link floor {floor:.3f} s), "
          f"MPI_Allreduce {mpi:.3f} s ({mpi / floor:.2f} x), hvdlite / MPI {hv / mpi:.3f}")


def _measure_into_copy(tmp_path: Path, flag: str) -> dict:
    """Runs cost_model.py's probe `flag` at 1 Gbit/s, one round, into a copy of the stored
    parameters, and returns what it stored."""
    params = tmp_path / "params.json"
    params.write_text((REPO / "benchmarks" / "cost_model_params.json").read_text())
    cmd = [sys.executable, str(REPO / "benchmarks" / "cost_model.py"), flag,
           "--rates", "1gbit", "--rounds", "1", "--params", str(params), "--no-json"]
    proc = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(proc.stdout[-800:])
    return json.loads(params.read_text())


def test_cost_model_measures_a_lone_pair_across_two_hosts(tmp_path: Path) -> None:
    """``cost_model.py --measure-pair-exchange`` runs its probe on 2 emulated hosts and
    stores, per rate, how long the 64 exchanges took against what the rate allows, posted
    as hvdlite's Exchange posts them and as MPI_Sendrecv does."""
    found = _measure_into_copy(tmp_path, "--measure-pair-exchange")["pair_exchange"]["1gbit"]
    (run,) = found["rounds"]
    for order in ("send_first", "sendrecv"):
        assert run[order]["exchanges"] == 64 and run[order]["piece"] == 2 << 20
        assert run[order]["ideal_s"] == pytest.approx((2 << 20) / _rate_bytes("1gbit"))
        # 128 MiB cannot pass the token bucket in much less than the rate's time, so
        # the factor cannot be far below 1.
        assert 0.9 < run[order]["factor"] < 4 and 0.0 <= run[order]["slow_fraction"] <= 1.0
    assert found["factor"] == run["send_first"]["factor"]
    assert found["sendrecv_factor"] == run["sendrecv"]["factor"]


def test_cost_model_measures_small_messages_across_two_hosts(tmp_path: Path) -> None:
    """``cost_model.py --measure-small`` times small exchanges and MPI_Allreduce between
    2 emulated hosts and stores the exchange table the model interpolates and the number
    of exchanges Open MPI's two-rank allreduce makes at each size."""
    found = _measure_into_copy(tmp_path, "--measure-small")["small_messages"]["1gbit"]
    (run,) = found["rounds"]
    sizes = [str(s) for s in (8, 512, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10)]
    assert sorted(found["exchange_s"], key=int) == sizes and sorted(found["mpi_steps"], key=int) == sizes
    for s in sizes:
        assert found["exchange_s"][s] == run["exchange"][s]
        # a TCP round trip between namespaces takes microseconds; nothing here takes a second
        assert 1e-6 < found["exchange_s"][s] < 0.1 and 1e-6 < found["mpi_allreduce_s"][s] < 0.1
        assert found["mpi_steps"][s] in (1, 2)
    # 64 KiB moves 8192 times the bytes of 8 B; per-message costs do not hide that entirely
    assert found["exchange_s"]["65536"] > found["exchange_s"]["8"]
