"""Faults in an elastic job (``--min-np 2 --max-np 3``) on 3 emulated hosts with one
worker each, training the elastic tests' PyTorch script (``ElasticSampler``,
``TorchState`` committed every 2 steps) while the discovery script keeps listing all
three hosts:

* h3 is cut off from the network: the two others count its worker as failed within
  ``--failure-timeout`` and go on; the cut-off worker, alone and not a majority, stops,
  with its host's daemon, rather than train on as a second job;
* h2's worker is stopped (SIGSTOP): the others go on without it.

Each time the job ends with status 0, the survivors hold the same parameters, every
sample of every epoch was trained exactly once, and nothing of the job is left on any
host a minute after the launcher exits.

Needs root (network namespaces); skipped with the reason otherwise."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.elastic.test_elastic import TRAIN, _check_each_sample_trained_once
from tests.faults.harness import FaultJob
from tests.hosts.emulated import EmulatedHosts

FAILURE_TIMEOUT_S = 10.0


def _elastic_job(hosts: EmulatedHosts, tmp_path: Path) -> tuple[FaultJob, Path]:
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\n" + "".join(f"echo {h}:1\n" for h in hosts.hosts))
    script.chmod(0o755)
    job = FaultJob(hosts, 3, TRAIN, args=["--out", str(out), "--epochs", "12", "--step-sleep", "0.05"],
                   launcher_args=["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(script),
                                  "--failure-timeout", f"{FAILURE_TIMEOUT_S:g}"],
                   env={"HVDLITE_TEST_PRINT_STEPS": "1"})
    return job, out


def _longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def _check_survivors(job: FaultJob, out: Path, survivors: set[str], rc: int | None) -> dict[str, float]:
    detail = job.output(300)
    assert rc == 0, f"exit status {rc}\n{detail}"
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert len(results) == len(survivors), (len(results), detail)
    assert all(r["size"] == len(survivors) for r in results), [r["size"] for r in results]
    assert len({r["params_sha"] for r in results}) == 1, detail
    assert len({r["steps"] for r in results}) == 1
    _check_each_sample_trained_once(results[0], 480)
    return {"longest gap": max(_longest_gap(r["completed"]) for r in results)}


@pytest.mark.timeout(300)
def test_a_host_cut_off_is_left_behind_and_stops_alone(hosts: EmulatedHosts, tmp_path: Path) -> None:
    job, out = _elastic_job(hosts, tmp_path)
    job.start()
    try:
        assert job.wait_for_step(30), job.output()
        job.cut("h3")
        t_cut = time.time()
        rc = job.wait(timeout=240)
        assert rc is not None, f"the job did not end\n{job.output(300)}"
        figures = _check_survivors(job, out, {"h1", "h2"}, rc)
        print(f"cut-off host: longest gap between two steps {figures['longest gap']:.1f} s")
        assert figures["longest gap"] <= FAILURE_TIMEOUT_S + 5, figures
        assert any("failed; continuing with 2 workers" in line for _, line in job.lines), job.output(300)
        # The cut-off side stopped by itself: nothing of the job is left on h3 (nor on
        # the others) within a minute of the launcher's exit.
        left = job.wait_for_no_leftovers(60)
        print(f"cut-off host: its processes gone {time.time() - t_cut:.0f} s after the cut")
        assert left == {}, left
    finally:
        job.mend("h3")
        job.stop()


@pytest.mark.timeout(300)
def test_a_frozen_worker_is_left_behind(hosts: EmulatedHosts, tmp_path: Path) -> None:
    job, out = _elastic_job(hosts, tmp_path)
    job.start()
    try:
        assert job.wait_for_step(30), job.output()
        frozen = job.freeze("h2")
        assert len(frozen) == 1, frozen
        rc = job.wait(timeout=240)
        assert rc is not None, f"the job did not end\n{job.output(300)}"
        figures = _check_survivors(job, out, {"h1", "h3"}, rc)
        print(f"frozen worker: longest gap between two steps {figures['longest gap']:.1f} s")
        assert figures["longest gap"] <= FAILURE_TIMEOUT_S + 5, figures
        left = job.wait_for_no_leftovers(60)
        assert left == {}, left
    finally:
        job.stop()
